// `retrysafe/store`: the contract a store implements and the engine calls.
// Imports in src/ outside src/core: a name from the face for authors of that kind (src/adapters:
// ./adapter.ts, src/stores: ./store.ts, src/testing: the faces of what it tests), as an outside
// author would; else from the core module defining it; never ./index.ts (a store never loads the engine).
export {
  type AbandonedOptions,
  type AbandonedRecord,
  type AdminStore,
  type AtomicResult,
  type AtomicStore,
  type AtomicWorkResult,
  type ClaimInput,
  type ClaimResult,
  type GetKeyOptions,
  type IdempotencyStore,
  isAtomicStore,
  isPhaseStore,
  type KeyPage,
  type KeyRecord,
  type KeyRecordSummary,
  type ListKeysOptions,
  MAX_LIST_LIMIT,
  type PhaseStore,
  type RequestStore,
  type SavedStep,
  type StepStore,
  type StoredResponse,
} from './contract/index.js';
