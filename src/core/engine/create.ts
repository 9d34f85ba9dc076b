import type { IdempotencyOptions } from '../options/index.js';
import { resolveOptions } from '../options/index.js';
import { answerHeaders, bodyTooLarge, ResponseCollector, render } from '../response/index.js';
import type { Idempotency } from './adapter-contract.js';
import { execute, prepare, resume } from './journey.js';
import { rejected } from './journey-state.js';
import { engineState } from './state.js';

/**
 * Creates the engine adapters wrap. Options are checked here, once.
 * @example
 * const idempotency = createIdempotency({ store: sqliteStore({ url: 'app.db', migrate: true }), ttl: '7d' });
 */
export function createIdempotency<Req = unknown, Tx = unknown>(
  options: IdempotencyOptions<Req, Tx>,
): Idempotency<Req, Tx> {
  const engine = engineState(resolveOptions(options));
  const { config } = engine;
  const overflow = config.mode === 'lease' ? 'stream' : 'drop';
  return {
    mode: config.mode,
    keyHeader: config.keyHeader,
    maxBodyBytes: config.maxBodyBytes,
    maxResponseBytes: config.maxResponseBytes,
    resume: (record, run, signal) => resume(engine, record, run, signal),
    handle: (request, run) => execute(engine, () => prepare(engine, request), run),
    render: (error) => render(config, error),
    answerHeaders: (key) => answerHeaders(config, key),
    // Every adapter makes this error once per oversized request, guarded or not yet known to be.
    bodyTooLarge: () => {
      const error = bodyTooLarge(config);
      rejected(engine, error, 'body_too_large');
      return error;
    },
    collect: () => new ResponseCollector(config.maxResponseBytes, overflow, config.storedHeaderNames),
  };
}
