// `retrysafe/adapter`: what a framework binding needs beyond the application's API (`retrysafe`):
// the engine it drives (`createIdempotency`), the request it hands in, the collector of the
// handler's response and the outcome it sends.
// Imports in src/ outside src/core: a name from the face for authors of that kind (src/adapters:
// ./adapter.ts, src/stores: ./store.ts, src/testing: the faces of what it tests), as an outside
// author would; else from the core module defining it; never ./index.ts (a store never loads the engine).
export type { AbandonedRecord, StoredResponse } from './contract/index.js';
export { createIdempotency, type Idempotency, type Outcome, type ResumedRequest } from './engine/index.js';
export {
  type FingerprintInput,
  fingerprint,
  type IncomingRequest,
  type KeyBounds,
  type ParsedBody,
  type ParsedKey,
  parsedBody,
  parseIdempotencyKey,
  type RequestBody,
} from './request/index.js';
export type { CapturedResponse, CollectorState, HeaderReader, ResponseCollector } from './response/index.js';
