import type { RequestBody } from './fingerprint.js';

/** What an adapter knows of an incoming request. */
export interface IncomingRequest<Req = unknown> {
  method: string;
  /** Path and query string. */
  path: string;
  /**
   * The value of the engine's `keyHeader` (`Idempotency-Key` unless `headerName` says otherwise):
   * an array when it appeared more than once; `undefined` when absent or when `keyHeader` is.
   */
  keyHeader: string | readonly string[] | undefined;
  contentType: string | undefined;
  /**
   * The `Accept-Encoding` header: a replay stored compressed is decoded for a request that does
   * not accept its coding. Absent or `undefined`: the request sent none, and gets it decoded.
   */
  acceptEncoding?: string | undefined;
  /** The `Authorization` header, for the default `scope`. */
  authorization: string | undefined;
  /**
   * Reads the body; called at most once and only for guarded requests. A body a parser already
   * consumed is handed over as `parsedBody(value)`; the engine answers 413 past `maxBodyBytes`.
   */
  readBody: () => RequestBody | Promise<RequestBody>;
  /** The framework's request, handed to `scope`. */
  raw: Req;
}
