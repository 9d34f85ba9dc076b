export type { CollectorState, HeaderReader, ResponseCollector } from './collector.js';
export {
  type CompleterOptions,
  resumeAbandoned,
  type StartCompleterOptions,
  startCompleter,
} from './completer.js';
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
  type ResumedRequest,
} from './engine.js';
export {
  ConfigError,
  ErrorCode,
  IdempotencyError,
  isIdempotencyError,
  isStepFenced,
  RetrysafeError,
  StepFencedError,
} from './errors.js';
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
  ResumedEvent,
  StepReplayedEvent,
  StepSavedEvent,
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
export { type KeyBounds, type ParsedKey, parseIdempotencyKey } from './key.js';
export { credentialScope } from './scope.js';
export {
  type AbandonedOptions,
  type AbandonedRecord,
  type AtomicResult,
  type AtomicStore,
  type AtomicWorkResult,
  type ClaimInput,
  type ClaimResult,
  type IdempotencyStore,
  isAtomicStore,
  isPhaseStore,
  type KeyPage,
  type KeyRecordSummary,
  type ListKeysOptions,
  MAX_LIST_LIMIT,
  type PhaseStore,
  type Register,
  type RegisteredTx,
  type SavedStep,
  type StoredResponse,
} from './types.js';
