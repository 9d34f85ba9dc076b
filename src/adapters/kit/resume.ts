import { randomUUID } from 'node:crypto';
import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import type {
  AbandonedRecord,
  CapturedResponse,
  Idempotency,
  Outcome,
  ResponseCollector,
  ResumedRequest,
} from '../../core/adapter.js';
import { RetrysafeError } from '../../core/contract/index.js';
import type { IdempotencyContext } from '../../core/engine/index.js';
import { capture, sendAnswer } from './node-http.js';

// The completer's way through an application: a saved request is dispatched through the app
// itself (its routes, middleware and handler), marked so that the guard it reaches hands the
// handler the completer's context instead of claiming the key again.

/**
 * The header marking a resumed request: its value is a random token, known only to this process
 * while the resume runs, so a client cannot pass a request of its own off as one.
 */
export const RESUME_HEADER = 'x-retrysafe-resume';

/** A resume under way, waiting for the guard its request reaches. */
export interface PendingResume {
  /** The context the engine's resume claimed, for the handler. */
  ctx: IdempotencyContext<unknown>;
  /** A collector of the engine that claimed, for the handler's response. */
  collect(): ResponseCollector;
  /** Settles the resume with the handler's captured response, or its error. */
  settle(response: Promise<CapturedResponse>): void;
}

const pending = new Map<string, PendingResume>();

/**
 * The resume a request's {@link RESUME_HEADER} value names, taken (a second request with the same
 * token is an ordinary one); `undefined` for any other request.
 */
export function takeResume(value: string | readonly string[] | null | undefined): PendingResume | undefined {
  if (typeof value !== 'string') return undefined;
  const resume = pending.get(value);
  if (resume !== undefined) pending.delete(value);
  return resume;
}

/**
 * Sends a saved request through the application: `headers` carry the content type, the key and
 * the resume's token. Resolves with the status the application answered once it answered.
 */
export type Dispatch = (request: ResumedRequest, headers: Record<string, string>) => Promise<number>;

/** What `resumeThrough` gives `startCompleter` / `resumeAbandoned` as `resume`. */
export type Resume = (record: AbandonedRecord, signal?: AbortSignal) => Promise<Outcome | undefined>;

/** What each adapter's guard offers a completer: its way into the app the guard is mounted on. */
export interface ResumesThrough<App> {
  /**
   * A `resume` for `startCompleter` / `resumeAbandoned` that sends each abandoned operation's
   * saved request (method, path, `Content-Type`, body, key; never `Authorization`) through `app`,
   * so its middleware, this guard and the route's handler run as for the client's request. The
   * guard recognises the resumed request and hands the handler the resumed operation (its
   * finished steps answer their saved results) instead of claiming the key; the answer is saved
   * for the client's late retry. Middleware in front of the guard must let it through.
   * @example
   * startCompleter({ store, resume: idem.resumeThrough(app) });
   */
  resumeThrough(app: App): Resume;
}

/**
 * A completer's `resume` that re-drives each abandoned record `engine` claims through `dispatch`.
 * A request that is answered without reaching a guard (no such route any more, a middleware in
 * front refusing it) counts as a handler that failed: the lease is ended and the steps kept.
 */
export function resumeVia<Tx>(engine: Idempotency<never, Tx>, dispatch: Dispatch): Resume {
  return (record, signal) =>
    engine.resume(
      record,
      (ctx, saved) =>
        new Promise<CapturedResponse>((resolve, reject) => {
          const token = randomUUID();
          const forget = () => pending.delete(token);
          pending.set(token, {
            ctx: ctx as IdempotencyContext<unknown>,
            collect: () => engine.collect(),
            settle: (response) => response.then(resolve, reject),
          });
          signal?.addEventListener('abort', forget, { once: true });
          const headers: Record<string, string> = { [RESUME_HEADER]: token };
          if (saved.contentType !== undefined) headers['content-type'] = saved.contentType;
          if (engine.keyHeader !== undefined) headers[engine.keyHeader] = saved.key;
          dispatch(saved, headers).then(
            (status) => {
              if (forget())
                reject(
                  new RetrysafeError(
                    `retrysafe: the resumed ${saved.method} ${saved.path} (key ${saved.key}) was answered ${status} without reaching the idempotency guard`,
                  ),
                );
            },
            (error: unknown) => {
              if (forget()) reject(error);
            },
          );
        }),
      signal,
    );
}

/** A node:http request listener: an Express app, Koa's `app.callback()`, `createServer`'s handler. */
export type NodeListener = (req: IncomingMessage, res: ServerResponse) => unknown;

/**
 * Dispatches through a node:http listener with a request and response of no connection: the
 * request streams the saved body, what the application answers goes nowhere.
 */
export function nodeDispatch(listener: () => NodeListener): Dispatch {
  return (saved, headers) =>
    new Promise<number>((resolve, reject) => {
      const req = new IncomingMessage(new Socket());
      req.method = saved.method;
      req.url = saved.path;
      Object.assign(req.headers, headers, { 'content-length': String(saved.body.byteLength) });
      req.push(Buffer.from(saved.body));
      req.push(null);
      const res = new ServerResponse(req);
      // A response of no socket never emits 'finish': its end is what says it was answered.
      const end = res.end;
      res.end = function ended(this: ServerResponse, ...args: unknown[]) {
        res.end = end;
        const result = (end as (...args: unknown[]) => ServerResponse).apply(this, args);
        resolve(res.statusCode);
        return result;
      } as ServerResponse['end'];
      try {
        const running = listener()(req, res) as PromiseLike<unknown> | undefined;
        if (typeof running?.then === 'function') running.then(undefined, reject);
      } catch (error) {
        reject(error);
      }
    });
}

/**
 * Runs a resumed request's handler (`invoke`) with `res` captured for the engine that resumed it,
 * and ends the detached response with what it answered.
 */
export async function runResumed(resume: PendingResume, res: ServerResponse, invoke: () => unknown) {
  const captured = capture(resume, res, invoke);
  resume.settle(captured);
  sendAnswer(res, { kind: 'executed', response: await captured }, undefined);
}

/** Something that answers Web-standard `Request`s: a Hono app, a guarded fetch handler. */
export type FetchListener = (request: Request) => Response | Promise<Response>;

/** Dispatches through a Web-standard handler; the Response it answers is dropped. */
export function fetchDispatch(listener: FetchListener): Dispatch {
  return async (saved, headers) => {
    const request = new Request(new URL(saved.path, 'http://localhost'), {
      method: saved.method,
      headers,
      body:
        saved.method === 'GET' || saved.method === 'HEAD' ? null : (saved.body as Uint8Array<ArrayBuffer>),
    });
    const response = await listener(request);
    await response.body?.cancel();
    return response.status;
  };
}

/** Fastify's `inject`, the one method of an instance a dispatch needs. */
export interface Injectable {
  inject(options: {
    method: string;
    url: string;
    headers: Record<string, string>;
    payload: Buffer;
  }): PromiseLike<{ statusCode: number }>;
}

/** Dispatches through a Fastify instance's `inject` (light-my-request: no socket either). */
export function injectDispatch(app: Injectable): Dispatch {
  return async (saved, headers) => {
    const response = await app.inject({
      method: saved.method,
      url: saved.path,
      headers,
      payload: Buffer.from(saved.body),
    });
    return response.statusCode;
  };
}
