export type { CollectorState, HeaderReader, ResponseCollector } from './collector.js';
export type { EncryptionKey } from './crypto.js';
export { type Duration, parseDuration } from './duration.js';
export {
  type CapturedResponse,
  createIdempotency,
  DEFAULT_REPLAY_HEADERS,
  defaultStoreStatus,
  type Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  type IncomingRequest,
  type Outcome,
  REPLAYED_HEADER,
} from './engine.js';
export { ConfigError, ErrorCode, IdempotencyError, isIdempotencyError, RetrysafeError } from './errors.js';
export type {
  ConflictEvent,
  ExecutedEvent,
  FencedEvent,
  IdempotencyEvent,
  IdempotencyEventListener,
  IdempotencyEventType,
  LeaseLostEvent,
  LeaseRenewedEvent,
  RejectedEvent,
  ReleasedEvent,
  ReplayedEvent,
  StoreErrorEvent,
  WaitedEvent,
} from './events.js';
export { eventDetail } from './events.js';
export {
  type FingerprintBody,
  type FingerprintInput,
  fingerprint,
  type ParsedBody,
  parsedBody,
  type RequestBody,
} from './fingerprint.js';
export { type IdempotentOptions, type IdempotentRun, idempotent } from './idempotent.js';
export { type KeyBounds, type ParsedKey, parseIdempotencyKey } from './key.js';
export { credentialScope } from './scope.js';
export {
  type AtomicResult,
  type AtomicStore,
  type AtomicWorkResult,
  type ClaimInput,
  type ClaimResult,
  type IdempotencyStore,
  isAtomicStore,
  type KeyPage,
  type KeyRecordSummary,
  type ListKeysOptions,
  MAX_LIST_LIMIT,
  type Register,
  type RegisteredTx,
  type StoredResponse,
} from './types.js';
