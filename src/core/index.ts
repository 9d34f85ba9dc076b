// `retrysafe`: what an application's code uses. A framework binding's plumbing is in ./adapter.ts
// (`retrysafe/adapter`), the store contract in ./store.ts (`retrysafe/store`).
// Imports in src/ outside src/core: a name from the face for authors of that kind (src/adapters:
// ./adapter.ts, src/stores: ./store.ts, src/testing: the faces of what it tests), as an outside
// author would; else from the core module defining it; never ./index.ts (a store never loads the engine).
export type {
  CircuitEvent,
  ConflictEvent,
  ExecutedEvent,
  FencedEvent,
  GaveUpEvent,
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
  TransactionEndedEvent,
  WaitedEvent,
} from './contract/index.js';
export {
  ConfigError,
  ErrorCode,
  eventDetail,
  IdempotencyError,
  isIdempotencyError,
  isStepFenced,
  isTransactionEnded,
  type Register,
  type RegisteredTx,
  RetrysafeError,
  StepFencedError,
  TransactionEndedError,
} from './contract/index.js';
export {
  type CircuitState,
  type CompleterOptions,
  type IdempotencyContext,
  resumeAbandoned,
  type StartCompleterOptions,
  startCompleter,
  storeCircuit,
} from './engine/index.js';
export { idempotency } from './framework-entry.js';
export { type IdempotentOptions, type IdempotentRun, idempotent } from './jobs/index.js';
export {
  DEFAULT_REPLAY_HEADERS,
  type Duration,
  defaultStoreStatus,
  type IdempotencyOptions,
  IETF_DRAFT_ERRORS_URL,
  parseDuration,
  REPLAYED_HEADER,
} from './options/index.js';
export { credentialScope, type FingerprintBody } from './request/index.js';
export { type EncryptionKey, type StoredResponseView, storedResponseView } from './response/index.js';
