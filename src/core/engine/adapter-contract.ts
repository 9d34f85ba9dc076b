import type { IdempotencyError, StoredResponse } from '../contract/index.js';
import type { IncomingRequest } from '../request/index.js';
import type { CapturedResponse, ResponseCollector } from '../response/index.js';

// What an adapter and the engine exchange: the request in, the handler's response, the outcome out.

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
  /** The 413 error an adapter's `readBody` throws past `maxBodyBytes`; `handle` answers it. */
  bodyTooLarge(): IdempotencyError;
  /** A collector for one handler's response, which the adapter feeds as the response goes out. */
  collect(): ResponseCollector;
}
