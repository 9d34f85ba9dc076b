import type { CollectorState, ResponseCollector } from '../../core/adapter.js';

// A handler's body read chunk by chunk into the engine's collector, and what goes out once it
// outgrew `maxResponseBytes`: shared by the adapters that read the body as a stream (Fastify's
// and Koa's payloads, Web-standard Responses). And how much of a refused request body is read
// and dropped, by the node:http drain and the Web-standard one alike.

/** The next chunk of a body, as a node stream's iterator or a Web stream's reader gives it. */
export type ReadChunk = () => Promise<{ done: true } | { done: false; value: Uint8Array }>;

/**
 * Feeds the body to the collector until it ends (`keep`: all of it kept) or the collector stops
 * keeping it (`stream`, lease mode: send {@link keptThenRest}; `drop`, atomic mode: send nothing).
 */
export async function feed(collector: ResponseCollector, read: ReadChunk): Promise<CollectorState> {
  for (;;) {
    const next = await read();
    if (next.done) return 'keep';
    const state = collector.add(next.value);
    if (state !== 'keep') return state;
  }
}

/** A body that outgrew the collector: the chunks it kept, then the rest as it is read. */
export async function* keptThenRest(
  collector: ResponseCollector,
  read: ReadChunk,
): AsyncGenerator<Uint8Array> {
  yield* collector.take();
  for (;;) {
    const next = await read();
    if (next.done) return;
    yield next.value;
  }
}

/**
 * How much of a refused request body (413) is read and dropped, and for how long, before the
 * connection is closed anyway. Closing a socket that still has unread bytes makes the kernel reset
 * it, and a client still writing its upload (Node's fetch among them) then sees EPIPE instead of
 * the 413 it was sent, and retries a request that can never succeed. Reading the rest lets it
 * finish writing, or read the answer and hang up; the bounds keep a client from streaming into
 * the server for ever. 8 MiB covers the few-megabyte uploads that typically overshoot the 1 MiB
 * default limit; 5 s is ample to carry that much on any working link.
 */
export const DRAIN_MAX_BYTES = 8 * 1024 * 1024;
export const DRAIN_MAX_MS = 5_000;
