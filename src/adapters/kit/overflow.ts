import type { CollectorState, ResponseCollector } from '../../core/adapter.js';

// A handler's body read chunk by chunk into the engine's collector, and what goes out once it
// outgrew `maxResponseBytes`: shared by the adapters that read the body as a stream (Fastify's
// and Koa's payloads, Web-standard Responses).

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
