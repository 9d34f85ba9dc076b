import { Readable } from 'node:stream';
import type { ResponseCollector } from '../../core/adapter.js';
import { RetrysafeError } from '../../core/contract/index.js';
import { feed, keptThenRest, type ReadChunk } from './overflow.js';

// Response capture shared by the adapters that see the response as a payload before it is
// written (fastify's onSend, koa's ctx.body), rather than as node:http writes.

/**
 * Feeds a response payload (Fastify's onSend payload, Koa's serialised `ctx.body`) to the
 * engine's collector and gives back the payload to send: as it was, or, for a stream, what was
 * read followed by the rest (lease mode past `maxResponseBytes`); nothing when the collector
 * dropped it (atomic mode past the limit: the engine rolls back and answers 500).
 */
export async function captureBody(
  collector: ResponseCollector,
  payload: unknown,
): Promise<{ payload: unknown }> {
  if (payload === undefined || payload === null) return { payload };
  if (typeof payload === 'string' || payload instanceof Uint8Array) {
    const state = collector.add(typeof payload === 'string' ? Buffer.from(payload) : payload);
    return { payload: state === 'drop' ? undefined : payload };
  }
  if (!(payload instanceof Readable)) {
    throw new RetrysafeError('retrysafe: a response payload is neither string, Buffer nor stream');
  }
  const iterator = payload[Symbol.asyncIterator]();
  const read: ReadChunk = () =>
    iterator
      .next()
      .then((next) =>
        next.done
          ? next
          : { done: false, value: Buffer.isBuffer(next.value) ? next.value : Buffer.from(next.value) },
      );
  const state = await feed(collector, read);
  if (state === 'keep') {
    const body = collector.body();
    return { payload: Buffer.from(body.buffer, body.byteOffset, body.byteLength) };
  }
  if (state === 'drop') {
    payload.destroy();
    return { payload: undefined };
  }
  return { payload: Readable.from(keptThenRest(collector, read), { objectMode: false }) };
}
