import { Readable } from 'node:stream';
import type { Idempotency } from '../core/index.js';

// Response capture shared by the adapters that see the response as a payload before it is
// written (fastify's onSend, koa's ctx.body), rather than as node:http writes.

export function headersOf(headers: Record<string, unknown>): Record<string, string> {
  const flat: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined) flat[name] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return flat;
}

/**
 * The bytes of a response payload (Fastify's onSend payload, Koa's serialised `ctx.body`). A stream is read up to `maxResponseBytes`; past that (for any
 * payload), lease mode sends it on unsaved — what was read, then the rest of the stream — and
 * atomic mode drops it (the engine rolls back and answers 500).
 */
export async function captureBody(
  engine: Pick<Idempotency, 'mode' | 'maxResponseBytes'>,
  payload: unknown,
): Promise<{ body: Uint8Array; complete: boolean; payload: unknown }> {
  if (payload === undefined || payload === null) return { body: new Uint8Array(0), complete: true, payload };
  if (typeof payload === 'string' || payload instanceof Uint8Array) {
    const body = typeof payload === 'string' ? Buffer.from(payload) : payload;
    if (body.byteLength <= engine.maxResponseBytes) return { body, complete: true, payload };
    return {
      body: new Uint8Array(0),
      complete: false,
      payload: engine.mode === 'atomic' ? undefined : payload,
    };
  }
  if (!(payload instanceof Readable)) {
    throw new TypeError('retrysafe: a response payload is neither string, Buffer nor stream');
  }
  const chunks: Buffer[] = [];
  let size = 0;
  const iterator = payload[Symbol.asyncIterator]();
  for (;;) {
    const next = await iterator.next();
    if (next.done) {
      const body = Buffer.concat(chunks);
      return { body, complete: true, payload: body };
    }
    const chunk = Buffer.isBuffer(next.value) ? next.value : Buffer.from(next.value);
    size += chunk.length;
    chunks.push(chunk);
    if (size > engine.maxResponseBytes) break;
  }
  if (engine.mode === 'atomic') {
    payload.destroy();
    return { body: new Uint8Array(0), complete: false, payload: undefined };
  }
  const rest = Readable.from(
    (async function* streamThrough() {
      yield* chunks;
      for (;;) {
        const next = await iterator.next();
        if (next.done) return;
        yield next.value;
      }
    })(),
    { objectMode: false },
  );
  return { body: new Uint8Array(0), complete: false, payload: rest };
}
