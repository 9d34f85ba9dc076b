import { Readable } from 'node:stream';
import { type ResponseCollector, RetrysafeError } from '../../core/index.js';

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
  for (;;) {
    const next = await iterator.next();
    if (next.done) {
      const body = collector.body();
      return { payload: Buffer.from(body.buffer, body.byteOffset, body.byteLength) };
    }
    const state = collector.add(Buffer.isBuffer(next.value) ? next.value : Buffer.from(next.value));
    if (state === 'drop') {
      payload.destroy();
      return { payload: undefined };
    }
    if (state === 'stream') break;
  }
  const kept = collector.take();
  const rest = Readable.from(
    (async function* streamThrough() {
      yield* kept;
      for (;;) {
        const next = await iterator.next();
        if (next.done) return;
        yield next.value;
      }
    })(),
    { objectMode: false },
  );
  return { payload: rest };
}
