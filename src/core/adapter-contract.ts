import type { ResponseCollector } from './collector.js';
import type { IdempotencyError } from './errors.js';
import type { RequestBody } from './fingerprint.js';
import type { StoredResponse } from './types.js';

// What an adapter and the engine exchange: the request in, the handler's response, the outcome out.

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

/** Handed to the handler of a guarded request. */
export interface IdempotencyContext<Tx = unknown> {
  key: string;
  scope: string;
  fingerprint: string;
  /** The open transaction in atomic mode (the store's client); `undefined` in lease mode. */
  tx: Tx | undefined;
  /** A key for a downstream provider derived from ours, so its retries are idempotent too. */
  downstreamKey(purpose: string): string;
}

/** A response as an adapter captured it from the handler. */
export interface CapturedResponse extends StoredResponse {
  /** `false` when the body outgrew `maxResponseBytes` and was streamed, not kept. */
  complete: boolean;
}

/**
 * What the adapter does next.
 * - `pass`: not guarded (method, no key on an optional route): run the handler as usual.
 * - `executed`: the handler ran; send `response` unless the adapter already streamed it.
 * - `replayed`: send the stored response (it carries `Idempotency-Replayed: true`).
 * - `rejected`: send `engine.render(error)`, or hand `error` to the framework's error path.
 */
export type Outcome =
  | { kind: 'pass' }
  | { kind: 'executed'; response: CapturedResponse }
  | { kind: 'replayed'; response: StoredResponse }
  | { kind: 'rejected'; error: IdempotencyError };

/** The engine `createIdempotency` returns: what an adapter drives for each request. */
export interface Idempotency<Req = unknown, Tx = unknown> {
  readonly mode: 'lease' | 'atomic';
  /** The lower-case header the key is read from; `undefined` when the `key` option reads it. */
  readonly keyHeader: string | undefined;
  readonly maxBodyBytes: number;
  readonly maxResponseBytes: number;
  /** Runs one request through the state machine; `run` invokes the handler and captures its response. */
  handle(
    request: IncomingRequest<Req>,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome>;
  /** The HTTP response for an engine error: `onError`'s, or JSON (`ietf`: problem+json). */
  render(error: IdempotencyError): StoredResponse;
  /**
   * Headers the adapter adds to the handler's fresh answer to a request keyed `key` (`echoKey`);
   * replays and rendered errors carry them already. Empty unless an option asks for some.
   */
  answerHeaders(key: string): Readonly<Record<string, string>>;
  /** The 413 error an adapter's `readBody` throws past `maxBodyBytes`; `handle` answers it. */
  bodyTooLarge(): IdempotencyError;
  /** A collector for one handler's response, which the adapter feeds as the response goes out. */
  collect(): ResponseCollector;
}
