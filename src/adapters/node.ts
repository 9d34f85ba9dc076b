import { IncomingMessage, type OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import {
  type AbandonedRecord,
  createIdempotency,
  type Outcome,
  type ResumedRequest,
} from '../core/adapter.js';
import { isIdempotencyError, type RegisteredTx } from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import type { IdempotencyOptions } from '../core/options/index.js';
import {
  capture,
  clearForAnswer,
  closeAfterDrain,
  engineOptionsOf,
  internalError,
  keyHeaderOf,
  type NodeListener,
  nodeDispatch,
  RESUME_HEADER,
  type ResumesThrough,
  readBody,
  resumeVia,
  runResumed,
  send,
  sendAnswer,
  takeResume,
} from './kit/index.js';

/** The request a wrapped handler sees: the body is already read, as bytes. */
export type BodyRequest = IncomingMessage & { body: Buffer };

/**
 * A node:http handler. `idem` is set for requests guarded by a key, `undefined` otherwise
 * (no key on an optional route, or a method that is not guarded).
 */
export type NodeHandler<Tx = RegisteredTx> = (
  req: BodyRequest,
  res: ServerResponse,
  idem: IdempotencyContext<Tx> | undefined,
) => unknown;

/**
 * A request and response of no connection, for a completer to drive a handler with: the request
 * carries the saved method, path, `content-type` and body (and the key in `headerName`); what the
 * handler answers is captured and saved, and goes nowhere else.
 */
function detachedExchange(saved: ResumedRequest, keyHeader: string | undefined) {
  const req = new IncomingMessage(new Socket());
  req.method = saved.method;
  req.url = saved.path;
  if (saved.contentType !== undefined) req.headers['content-type'] = saved.contentType;
  if (keyHeader !== undefined) req.headers[keyHeader] = saved.key;
  req.push(null);
  const res = new ServerResponse(req);
  return { req: Object.assign(req, { body: Buffer.from(saved.body) }) as BodyRequest, res };
}

/** A guarded node:http handler, and the completer's way into it. */
export interface GuardedNodeHandler {
  (req: IncomingMessage, res: ServerResponse): Promise<void>;
  /**
   * Re-drives an abandoned record (`store.abandoned()`) through this handler from its saved
   * request, for `resumeAbandoned` / `startCompleter`: the handler gets the finished steps and runs
   * the rest; its answer is saved, so the client's late retry replays it. `req` carries no
   * `Authorization` (never stored): the record's scope is kept as it was. Resolves with the
   * engine's outcome, `undefined` when the saved request cannot be read. Once `signal` aborts
   * the resume is given up: the operation's lease is ended for a later pass.
   * @example
   * startCompleter({ store, resume: (record, signal) => guarded.resume(record, signal) });
   */
  resume(record: AbandonedRecord, signal?: AbortSignal): Promise<Outcome | undefined>;
}

/** Options of `retrysafe/node`'s `idempotency`: the engine's options over node:http requests. */
export type NodeIdempotencyOptions<Tx = RegisteredTx> = IdempotencyOptions<IncomingMessage, Tx>;

/**
 * Guards node:http handlers with Idempotency-Key. The wrapper reads each request body (413 past
 * `maxBodyBytes`) into `req.body`, captures the guarded handler's response, saves it, and
 * replays it to retries. The handler's own errors become a 500 after the key is released.
 * @example
 * const guard = idempotency({ store: sqliteStore({ url: 'app.db', migrate: true }) });
 * http.createServer(guard(async (req, res, idem) => { res.writeHead(201).end('made') })).listen(8080);
 */
export function idempotency<Tx = RegisteredTx>(
  options: NodeIdempotencyOptions<Tx>,
): ((handler: NodeHandler<Tx>) => GuardedNodeHandler) & ResumesThrough<NodeListener> {
  const engine = createIdempotency<IncomingMessage, Tx>(engineOptionsOf('node idempotency()', options));
  function wrap(handler: NodeHandler<Tx>): GuardedNodeHandler {
    async function idempotentHandler(req: IncomingMessage, res: ServerResponse): Promise<void> {
      let body: Buffer;
      try {
        body = await readBody(req, engine);
      } catch (error) {
        if (isIdempotencyError(error)) {
          closeAfterDrain(req, res);
          return send(res, engine.render(error));
        }
        // The client went away mid-body: there is nobody to answer.
        res.destroy();
        return;
      }
      const request = Object.assign(req, { body }) as BodyRequest;
      const resume = takeResume(req.headers[RESUME_HEADER]);
      if (resume !== undefined) {
        const ctx = resume.ctx as IdempotencyContext<Tx>;
        return runResumed(resume, res, () => handler(request, res, ctx)).catch((error) =>
          internalError(res, error),
        );
      }
      let before: OutgoingHttpHeaders | undefined;
      try {
        const outcome = await engine.handle(
          {
            method: req.method ?? 'GET',
            path: req.url ?? '/',
            keyHeader: keyHeaderOf(req, engine.keyHeader),
            contentType: req.headers['content-type'],
            acceptEncoding: req.headers['accept-encoding'],
            authorization: req.headers.authorization,
            readBody: () => body,
            raw: req,
          },
          (ctx) => {
            before = res.getHeaders();
            return capture(engine, res, () => handler(request, res, ctx), engine.answerHeaders(ctx.key));
          },
        );
        switch (outcome.kind) {
          case 'pass':
            await handler(request, res, undefined);
            return;
          case 'executed':
          case 'replayed':
            return sendAnswer(res, outcome, before);
          case 'rejected':
            // Atomic mode could not commit what the handler answered: none of it may reach the client.
            clearForAnswer(req, res, before);
            return send(res, engine.render(outcome.error));
        }
      } catch (error) {
        if (!res.headersSent) clearForAnswer(req, res, before);
        internalError(res, error);
      }
    }
    return Object.assign(idempotentHandler, {
      resume: (record: AbandonedRecord, signal?: AbortSignal) =>
        engine.resume(
          record,
          (ctx, saved) => {
            const { req, res } = detachedExchange(saved, engine.keyHeader);
            return capture(engine, res, () => handler(req, res, ctx));
          },
          signal,
        ),
    });
  }
  // A server of many guarded handlers (a router) resumes through its listener, as the other
  // adapters do through their app.
  return Object.assign(wrap, {
    resumeThrough: (listener: NodeListener) =>
      resumeVia(
        engine,
        nodeDispatch(() => listener),
      ),
  });
}
