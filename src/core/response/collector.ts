import type { StoredResponse } from '../contract/index.js';

/** A response as an adapter captured it from the handler. */
export interface CapturedResponse extends StoredResponse {
  /** `false` when the body outgrew `maxResponseBytes` and was streamed, not kept. */
  complete: boolean;
}

/** What a collector does with the body: `keep` it; past the limit `stream` it on unsaved, or `drop` it. */
export type CollectorState = 'keep' | 'stream' | 'drop';

/** Reads one response header by its lower-case name, as the framework holds it. */
export type HeaderReader = (name: string) => string | number | readonly string[] | null | undefined;

const EMPTY = new Uint8Array(0);

/**
 * Collects a handler's response as an adapter sees it go out: the one place that decides what is
 * kept for replay. The body is kept up to `maxResponseBytes`. Past that, lease mode streams it on
 * unsaved (the adapter sends what was kept, from `take()`, then the rest) and the key is released;
 * atomic mode drops it, since nothing may reach the client before the commit (the engine rolls
 * back and answers 500). Only the headers the engine stores are read. Adapters get one per
 * response from `engine.collect()` and only feed it.
 */
export class ResponseCollector {
  private chunks: Uint8Array[] = [];
  private size = 0;
  state: CollectorState = 'keep';

  constructor(
    private readonly limit: number,
    private readonly overflow: 'stream' | 'drop',
    private readonly headerNames: readonly string[],
  ) {}

  /** Adds the next chunk of the body and answers what to do with the body from now on. */
  add(chunk: Uint8Array): CollectorState {
    if (this.state !== 'keep' || chunk.byteLength === 0) return this.state;
    this.size += chunk.byteLength;
    this.chunks.push(chunk);
    if (this.size > this.limit) {
      this.state = this.overflow;
      if (this.overflow === 'drop') this.chunks = [];
    }
    return this.state;
  }

  /** Hands over the chunks kept so far (the one that overflowed included), to send ahead of the rest. */
  take(): Uint8Array[] {
    const kept = this.chunks;
    this.chunks = [];
    return kept;
  }

  /** The body as kept: whole while it fits, empty once it streamed or was dropped. */
  body(): Uint8Array {
    if (this.state !== 'keep') return EMPTY;
    const { chunks } = this;
    if (chunks.length === 1) return chunks[0] as Uint8Array;
    const body = new Uint8Array(this.size);
    let offset = 0;
    for (const chunk of chunks) {
      body.set(chunk, offset);
      offset += chunk.byteLength;
    }
    return body;
  }

  /** The response for the engine: status, the stored headers `read` finds, and the body as kept. */
  response(status: number, read: HeaderReader): CapturedResponse {
    const headers: Record<string, string> = {};
    for (const name of this.headerNames) {
      const value = read(name);
      if (value !== undefined && value !== null) {
        headers[name] =
          typeof value === 'string' ? value : Array.isArray(value) ? value.join(', ') : String(value);
      }
    }
    return { status, headers, body: this.body(), complete: this.state === 'keep' };
  }
}
