export {
  type AdapterUnderTest,
  type AppOptions,
  CATALOG_POST_PATHS,
  countCall,
  describeAdapterConformance,
  listen,
  orderHeaders,
  orderJson,
  type Planned,
  paced,
  pacedStream,
  parsedJson,
  pattern,
  plan,
  type RunningApp,
  STREAM_CHUNK_BYTES,
  type StoreFactory,
  uploadFromAnotherThread,
} from './adapter-suite.js';
export { describeIdempotentConformance } from './idempotent-suite.js';
export { type MutationProbe, mutationProbes } from './probes.js';
export {
  type AtomicProbe,
  describeStoreConformance,
  type StoreUnderTest,
  useStoreUnderTest,
} from './store-suite.js';
