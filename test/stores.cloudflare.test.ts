import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import type { Miniflare } from 'miniflare';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DurableObjectNamespaceLike, durableObjectStore } from '../src/stores/cloudflare/index.js';
import { describeIdempotentConformance } from '../src/testing/idempotent-suite.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import { readWranglerConfig, startWorker, workerdSupported } from './support/workerd.js';

/**
 * The store contract against a real Durable Object on workerd: the suite runs here in Node, and
 * each call goes through Miniflare's binding of the object to the workerd process.
 */
const example = join(import.meta.dirname, '../examples/workers');
let worker: Miniflare | undefined;
let namespace: DurableObjectNamespaceLike;

describe.runIf(workerdSupported)('durableObjectStore on workerd', () => {
  beforeAll(async () => {
    worker = await startWorker(
      join(example, 'worker.js'),
      readWranglerConfig(join(example, 'wrangler.jsonc')),
    );
    namespace = (await worker.getDurableObjectNamespace(
      'IDEMPOTENCY',
    )) as unknown as DurableObjectNamespaceLike;
  });
  afterAll(() => worker?.dispose());

  // An object of its own per suite: the purge test counts exactly what it deleted.
  const onFreshObject = async () => ({ store: durableObjectStore({ namespace, name: randomUUID() }) });
  describeStoreConformance('durable object (workerd)', onFreshObject);
  describeIdempotentConformance('durable object (workerd)', onFreshObject);

  it('rejects bad options naming the option', () => {
    expect(() => durableObjectStore({} as never)).toThrow(/`namespace`/);
    expect(() => durableObjectStore({ namespace, name: '' })).toThrow(/`name`/);
    expect(() => durableObjectStore({ namespace, nmae: 'x' } as never)).toThrow(/nmae/);
  });
});
