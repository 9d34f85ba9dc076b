import type { EventEmitter } from 'node:events';
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type {
  CapturedResponse,
  Idempotency,
  Outcome,
  ResponseCollector,
  StoredResponse,
} from '../../core/adapter.js';
import type { IdempotencyError } from '../../core/contract/index.js';
import { DRAIN_MAX_BYTES, DRAIN_MAX_MS } from './overflow.js';

// node:http plumbing shared by the adapters whose responses are node ServerResponses (node, express).

/**
 * Whether {@link toDictionaryMode} pays on this Node. Measured by the bench's `tricks` scenario on
 * the guarded Express path: half the time per request on Node 20 and 22 (V8 11 and 12), a third
 * more on Node 24 (V8 13), where it is left out; not Node at all (workerd), left out.
 */
export function dictionaryModePays(nodeVersion: string | undefined): boolean {
  return nodeVersion !== undefined && Number(nodeVersion.split('.')[0]) < 24;
}

// workerd loads this module too (through the kit's index), with no `process.versions`.
const DICTIONARY_MODE_PAYS = dictionaryModePays(globalThis.process?.versions?.node);

/**
 * Switches a request or response object to V8's dictionary mode, on a Node where that pays
 * ({@link dictionaryModePays}). Express swaps the prototype of every req and res and then adds
 * properties to them, which leaves each one with a hidden class of its own: every property added
 * afterwards (by Express, the handler or us) copies that class, and property reads in Express and
 * node:http miss their inline caches. In dictionary mode an added property is a hash-table insert
 * and a read takes one generic path. Deleting a property other than the last one added is what
 * switches an object; `_maxListeners` is an own property of every EventEmitter, and is put back
 * with its value.
 */
export function toDictionaryMode(emitter: EventEmitter): void {
  if (!DICTIONARY_MODE_PAYS) return;
  const object = emitter as EventEmitter & { _maxListeners?: number };
  const maxListeners = object._maxListeners;
  delete object._maxListeners;
  object._maxListeners = maxListeners;
}

/**
 * Reads a body no parser read. Past `maxBodyBytes` it rejects with the engine's 413 error (which
 * `handle` answers) and stops reading; the rest is left for `closeAfterDrain`.
 */
export function readBody(
  req: IncomingMessage,
  engine: Pick<Idempotency, 'maxBodyBytes' | 'bodyTooLarge'>,
): Promise<Buffer> {
  const limit = engine.maxBodyBytes;
  const declared = Number(req.headers['content-length']);
  if (declared > limit) return Promise.reject(engine.bodyTooLarge());
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        req.removeAllListeners('data');
        req.resume();
        reject(engine.bodyTooLarge());
      } else chunks.push(chunk);
    });
    // `on`, not `once`: a stream emits each of these at most once, and a `once` listener costs a
    // wrapper and its removal.
    req.on('end', () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
    req.on('error', reject);
    req.on('aborted', () => reject(new Error('request aborted')));
  });
}

/** Every line of the lower-case header `header` (the engine's `keyHeader`), repeats kept apart. */
export function keyHeaderOf(req: IncomingMessage, header: string | undefined): string[] | undefined {
  return header === undefined ? undefined : req.headersDistinct[header];
}

// RFC 9110 §8.6: these carry no Content-Length (a 304's would describe the cached representation).
const withoutLength = (status: number) => status < 200 || status === 204 || status === 304;

export function send(res: ServerResponse, response: StoredResponse): void {
  answer(res, response.status, response.headers, response.body);
}

/**
 * Writes status, headers (besides those already on `res`) and body, the length declared unless
 * `res` already declares one.
 */
function answer(
  res: ServerResponse,
  status: number,
  headers: Record<string, string> | undefined,
  body: Uint8Array,
): void {
  if (res.headersSent) return;
  const declare = !withoutLength(status) && !res.hasHeader('content-length');
  for (const name in headers) res.setHeader(name, headers[name] as string);
  if (declare) res.setHeader('content-length', body.byteLength);
  res.writeHead(status);
  res.end(body);
}

/**
 * Makes the answer to a request whose body will not be read arrive instead of a reset:
 * `Connection: close`, the answer sent as soon as it is written, and the response (with it the
 * socket) ended only once the rest of the body was read and dropped, within the bounds above.
 * Call it before the answer is written, whether we or the framework's error path write it.
 */
export function closeAfterDrain(req: IncomingMessage, res: ServerResponse): void {
  if (req.complete || res.headersSent) return;
  res.setHeader('connection', 'close');
  const drained = drain(req);
  const end = res.end;
  res.end = ((chunk?: unknown, encoding?: unknown, callback?: unknown) => {
    res.end = end;
    if (typeof chunk === 'function') [chunk, callback] = [undefined, chunk];
    else if (typeof encoding === 'function') [encoding, callback] = [undefined, encoding];
    if (chunk !== undefined && chunk !== null) {
      const bytes =
        typeof chunk === 'string' ? Buffer.from(chunk, encodingOf(encoding)) : (chunk as Uint8Array);
      // With its length declared, the client can take the answer as complete before the end.
      if (!res.headersSent && !res.hasHeader('content-length')) {
        res.setHeader('content-length', bytes.byteLength);
      }
      res.write(bytes);
    }
    void drained.then(() => res.end(callback as (() => void) | undefined));
    return res;
  }) as typeof res.end;
}

function encodingOf(encoding: unknown): BufferEncoding {
  return typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8';
}

function drain(req: IncomingMessage): Promise<void> {
  return new Promise((resolve) => {
    if (req.complete || req.destroyed) return resolve();
    let bytes = 0;
    const stop = () => {
      clearTimeout(timer);
      req.off('data', count);
      req.off('end', stop);
      req.off('error', stop);
      req.off('close', stop);
      resolve();
    };
    const count = (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > DRAIN_MAX_BYTES) stop();
    };
    const timer = setTimeout(stop, DRAIN_MAX_MS);
    // Whatever was reading the body (a framework's parser, a tee) gave up on it.
    req.unpipe();
    req.on('data', count);
    req.once('end', stop);
    req.once('error', stop);
    req.once('close', stop);
    req.resume();
  });
}

/**
 * Sends the response of a handler that ran (unless it was streamed already) or of a replay.
 * `before`: the headers `res` had before the handler ran, when it ran.
 */
export function sendAnswer(
  res: ServerResponse,
  outcome: Extract<Outcome, { kind: 'executed' | 'replayed' }>,
  before: OutgoingHttpHeaders | undefined,
): void {
  if (outcome.kind === 'replayed') {
    // A handler whose lease was lost is answered with the saved response: none of its own headers.
    clearForAnswer(undefined, res, before);
    send(res, outcome.response);
  }
  // The captured headers are still set on `res`; only status and body were held back.
  else if (outcome.response.complete) answer(res, outcome.response.status, undefined, outcome.response.body);
}

/**
 * Readies `res` for an answer sent in the handler's place (a replay, an engine error): the
 * headers the handler set, when it ran (`before`: the ones `res` had until then), are dropped;
 * for an engine error (`error`) answered before the body was read (one too large, or a bad key,
 * refused before any of it is read), the rest is read off before the answer goes out, whoever
 * writes it: otherwise a client still uploading sees a reset instead of the answer.
 */
export function clearForAnswer(
  req: IncomingMessage | undefined,
  res: ServerResponse,
  before: OutgoingHttpHeaders | undefined,
  error?: IdempotencyError,
): void {
  if (before) resetHeaders(res, before);
  if (req && error !== undefined) closeAfterDrain(req, res);
}

/** Puts back the headers `res` had before the handler ran, dropping every one the handler set. */
function resetHeaders(res: ServerResponse, before: OutgoingHttpHeaders): void {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  for (const [name, value] of Object.entries(before)) if (value !== undefined) res.setHeader(name, value);
}

export function internalError(res: ServerResponse, error: unknown): void {
  console.error('retrysafe: handler failed', error);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  res.writeHead(500, { 'content-type': 'application/json; charset=utf-8' });
  res.end(
    JSON.stringify({
      error: 'internal_error',
      message: 'The request failed; it may be retried with the same key.',
    }),
  );
}

const HELD = Symbol('retrysafe.held');
type HoldingResponse = ServerResponse & { [HELD]?: Held };

/**
 * A handler's response held back on `res`: the methods it replaced (put back when the response
 * ends) and the collector its body goes to. The replacements are shared functions that find this
 * on the response (`res[HELD]`), so holding a response costs one object rather than a closure per method.
 */
class Held {
  readonly writeHead: ServerResponse['writeHead'];
  readonly write: ServerResponse['write'];
  readonly end: ServerResponse['end'];

  /** A stream piped into the response stopped before ending it (see {@link heldGone}). */
  abandoned = false;

  constructor(
    res: HoldingResponse,
    readonly collector: ResponseCollector,
    readonly resolve: (response: CapturedResponse) => void,
  ) {
    this.writeHead = res.writeHead;
    this.write = res.write;
    this.end = res.end;
    res[HELD] = this;
    res.writeHead = heldWriteHead as ServerResponse['writeHead'];
    res.write = heldWrite as ServerResponse['write'];
    res.end = heldEnd as ServerResponse['end'];
    res.on('close', heldGone);
    res.on('unpipe', heldUnpiped);
    // flushHeaders is left alone: it writes the head through writeHead, which holds it, and then
    // sends nothing. One property fewer: on an Express response each one added costs microseconds.
  }

  restore(res: HoldingResponse): void {
    res.writeHead = this.writeHead;
    res.write = this.write;
    res.end = this.end;
    res.off('close', heldGone);
    res.off('unpipe', heldUnpiped);
    res[HELD] = undefined;
  }

  keep(res: HoldingResponse, chunk: unknown, encoding: unknown): void {
    if (chunk === undefined || chunk === null || typeof chunk === 'function') return;
    const bytes =
      typeof chunk === 'string'
        ? Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8')
        : (chunk as Uint8Array);
    if (this.collector.add(bytes) !== 'stream') return;
    // The body outgrew maxResponseBytes in lease mode: from now on it goes straight out. write
    // and end stay held, so the end of the stream still settles the capture (and the key is released).
    (this.writeHead as (status: number) => ServerResponse).call(res, res.statusCode);
    for (const kept of this.collector.take()) (this.write as (chunk: Uint8Array) => boolean).call(res, kept);
  }
}

// Headers given to writeHead are moved onto `res`, so the collector reads all of them and the
// real writeHead later sends them unchanged (set-cookie arrays included).
function heldWriteHead(this: HoldingResponse, status: number, ...rest: unknown[]): ServerResponse {
  this.statusCode = status;
  if (typeof rest[0] === 'string') this.statusMessage = rest[0];
  const last = rest[rest.length - 1];
  if (Array.isArray(last)) {
    for (let i = 0; i + 1 < last.length; i += 2) this.appendHeader(String(last[i]), String(last[i + 1]));
  } else if (last && typeof last === 'object') {
    for (const [name, value] of Object.entries(last as OutgoingHttpHeaders)) {
      if (value !== undefined) this.setHeader(name, value);
    }
  }
  return this;
}

function heldWrite(this: HoldingResponse, chunk: unknown, encoding?: unknown, callback?: unknown): boolean {
  const held = this[HELD] as Held;
  if (held.collector.state === 'stream') {
    return held.write.call(this, chunk as never, encoding as never, callback as never);
  }
  held.keep(this, chunk, encoding);
  const done = typeof encoding === 'function' ? encoding : callback;
  if (typeof done === 'function') queueMicrotask(done as () => void);
  return true;
}

function heldEnd(
  this: HoldingResponse,
  chunk?: unknown,
  encoding?: unknown,
  callback?: unknown,
): ServerResponse {
  const held = this[HELD] as Held;
  const wasStreaming = held.collector.state === 'stream';
  if (!wasStreaming) held.keep(this, chunk, encoding);
  held.restore(this);
  if (wasStreaming) held.end.call(this, chunk as never, encoding as never, callback as never);
  // When this last chunk is what overflowed, keep() already sent it.
  else if (held.collector.state === 'stream') (held.end as () => ServerResponse).call(this);
  held.resolve(held.collector.response(this.statusCode, (name) => this.getHeader(name)));
  return this;
}

function heldUnpiped(this: HoldingResponse): void {
  (this[HELD] as Held).abandoned = true;
  heldGone.call(this);
}

/**
 * The connection closed before the response ended. A body piped into it (`stream.pipe(res)`,
 * `pipeline`, Nest's StreamableFile, Fastify's stream payloads) is unpiped or destroyed then and
 * never ends it, and a body already streaming past `maxResponseBytes` cannot be saved any more:
 * either way the capture settles now, as a response not all kept, so the key is released instead
 * of being renewed for ever. A handler still at work (nothing piped) is waited for: its answer is
 * saved for the client's retry, which must not run it a second time meanwhile.
 */
function heldGone(this: HoldingResponse): void {
  const held = this[HELD] as Held;
  if (!this.destroyed || (held.collector.state !== 'stream' && !held.abandoned)) return;
  held.restore(this);
  held.resolve({
    ...held.collector.response(this.statusCode, (name) => this.getHeader(name)),
    complete: false,
  });
}

/**
 * Runs `invoke` with whatever it writes to `res` thrown away, and settles once it ends the
 * response: for a framework that still answers after the answer was chosen. The headers it set
 * stay on `res`, for {@link clearForAnswer} to drop.
 */
export function discard(res: ServerResponse, invoke: () => void): Promise<void> {
  const { writeHead, write, end } = res;
  const restore = () => {
    res.writeHead = writeHead;
    res.write = write;
    res.end = end;
  };
  return new Promise<void>((resolve, reject) => {
    res.writeHead = (() => res) as unknown as ServerResponse['writeHead'];
    res.write = ((_chunk: unknown, encoding?: unknown, callback?: unknown) => {
      const done = typeof encoding === 'function' ? encoding : callback;
      if (typeof done === 'function') queueMicrotask(done as () => void);
      return true;
    }) as ServerResponse['write'];
    res.end = ((...args: unknown[]) => {
      restore();
      const done = args.find((arg) => typeof arg === 'function');
      if (done) queueMicrotask(done as () => void);
      resolve();
      return res;
    }) as ServerResponse['end'];
    try {
      invoke();
    } catch (error) {
      restore();
      reject(error);
    }
  });
}

/**
 * Runs the handler with `res` intercepted: status, headers and body are held back until the
 * engine has saved them (and, in atomic mode, committed), then sent. The engine's collector
 * decides what is kept; a lease-mode response that outgrows `maxResponseBytes` is streamed
 * through instead and reported as incomplete. `answerHeaders` (the engine's, for the request's
 * key) are set on `res` before the handler runs, so it may still change them.
 */
export function capture(
  engine: Pick<Idempotency, 'collect'>,
  res: ServerResponse,
  invoke: () => unknown,
  answerHeaders: Readonly<Record<string, string>> = {},
): Promise<CapturedResponse> {
  for (const name in answerHeaders) res.setHeader(name, answerHeaders[name] as string);
  return new Promise<CapturedResponse>((resolve, reject) => {
    const held = new Held(res, engine.collect(), resolve);
    const failed = (error: unknown) => {
      held.restore(res);
      reject(error);
    };
    // Called at once, not from a microtask: a promise chain per request costs more than the call.
    try {
      const running = invoke() as PromiseLike<unknown> | undefined;
      if (typeof running?.then === 'function') running.then(undefined, failed);
    } catch (error) {
      failed(error);
    }
  });
}
