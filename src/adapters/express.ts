import type { OutgoingHttpHeaders } from 'node:http';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { createIdempotency, type Idempotency, parsedBody, type RequestBody } from '../core/adapter.js';
import type { RegisteredTx } from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import type { IdempotencyOptions } from '../core/options/index.js';
import {
  capture,
  clearForAnswer,
  keyHeaderOf,
  type NodeListener,
  nodeDispatch,
  RESUME_HEADER,
  type RenderErrorsOption,
  type ResumesThrough,
  readBody,
  resumeVia,
  runResumed,
  send,
  sendAnswer,
  splitAdapterOptions,
  takeResume,
  toDictionaryMode,
} from './kit/index.js';

declare global {
  namespace Express {
    interface Request {
      /** Set by `retrysafe/express` on requests guarded by an Idempotency-Key; `undefined` otherwise. */
      idempotency?: IdempotencyContext<RegisteredTx>;
    }
  }
}

/** Options of `retrysafe/express`'s `idempotency`: the engine's, plus `renderErrors`. */
export interface ExpressIdempotencyOptions<Tx = RegisteredTx>
  extends IdempotencyOptions<Request, Tx>,
    RenderErrorsOption {
  /**
   * `true`: the middleware answers engine errors (bad or missing key 400, conflict 409/422, in
   * progress 409, body too large 413, store down 503) itself, as JSON (or `onError`'s rendering),
   * so a default Express app never turns them into its HTML error page.
   * `false`: they go down Express's error path with `next(err)`; `err` is an `IdempotencyError`
   * with `status`/`statusCode`, `code`, `headers` (e.g. `retry-after`) and `key`.
   * @default true
   * @example renderErrors: false
   */
  renderErrors?: boolean;
}

/**
 * Express 4 and 5 middleware guarding POST/PATCH routes with Idempotency-Key. Mount it per app,
 * router or route, after your body parser: the fingerprint uses `req.body` as the parser left it.
 * When no parser ran, the middleware reads the raw body itself (413 past `maxBodyBytes`) and
 * leaves it in `req.body` as a Buffer. The guarded handler finds `req.idempotency`; its response
 * (`res.json`, `res.send`, `res.write`…) is captured, saved and replayed to retries byte for byte.
 * A response larger than `maxResponseBytes` is streamed through in lease mode, not saved, and
 * the key released. An error the handler throws reaches your error middleware as usual; what
 * that answers is what is saved, so the default 500 releases the key and the retry runs again.
 * @example
 * app.post('/orders', express.json(), idempotency({ store, required: true }), (req, res) => {
 *   res.status(201).location(`/orders/${id}`).json({ id, key: req.idempotency?.key });
 * });
 */
export function idempotency<Tx = RegisteredTx>(
  options: ExpressIdempotencyOptions<Tx>,
): RequestHandler & ResumesThrough<NodeListener> {
  const { renderErrors, engineOptions } = splitAdapterOptions('express idempotency()', options);
  const engine = createIdempotency<Request, Tx>(engineOptions);

  async function guard(req: Request, res: Response, next: NextFunction): Promise<void> {
    const resume = takeResume(req.headers[RESUME_HEADER]);
    if (resume !== undefined) {
      await bodyOf(req, engine);
      req.idempotency = resume.ctx as IdempotencyContext<RegisteredTx>;
      return runResumed(resume, res, () => next());
    }
    let before: OutgoingHttpHeaders | undefined;
    const outcome = await engine.handle(
      {
        method: req.method,
        path: req.originalUrl,
        keyHeader: keyHeaderOf(req, engine.keyHeader),
        contentType: req.headers['content-type'],
        acceptEncoding: req.headers['accept-encoding'],
        authorization: req.headers.authorization,
        readBody: () => bodyOf(req, engine),
        raw: req,
      },
      (ctx) => {
        req.idempotency = ctx as IdempotencyContext<unknown> as IdempotencyContext<RegisteredTx>;
        before = res.getHeaders();
        return capture(engine, res, () => next(), engine.answerHeaders(ctx.key));
      },
    );
    switch (outcome.kind) {
      case 'pass':
        return next();
      case 'executed':
      case 'replayed':
        return sendAnswer(res, outcome, before);
      case 'rejected':
        // Atomic mode could not commit what the handler answered: none of it may reach the client.
        clearForAnswer(req, res, before, outcome.error);
        if (!renderErrors) return next(outcome.error);
        return send(res, engine.render(outcome.error));
    }
  }

  const middleware: RequestHandler = function idempotencyMiddleware(req, res, next) {
    toDictionaryMode(req);
    toDictionaryMode(res);
    // Express 4 ignores a rejected promise, so every failure is routed here: the client left
    // mid-body (nobody to answer) or the user's `scope` or the engine threw (their error path
    // decides). `req.destroyed` tells neither: a request whose body was read is destroyed too.
    guard(req, res, next).catch((error: unknown) => {
      if (res.destroyed || res.headersSent) res.destroy();
      else next(error);
    });
  };
  return Object.assign(middleware, {
    resumeThrough: (app: NodeListener) =>
      resumeVia(
        engine,
        nodeDispatch(() => app),
      ),
  });
}

function bodyOf(req: Request, engine: Idempotency<Request, unknown>): RequestBody | Promise<Uint8Array> {
  // A body parser mounted earlier consumed the stream (Express 5 leaves it ended, body-parser 1
  // sets `_body`): fingerprint what it parsed. JSON is canonicalised, so re-serialising is exact.
  if (req.readableEnded || (req as { _body?: boolean })._body) return parsedBody(req.body);
  return readUnparsed(req, engine);
}

async function readUnparsed(req: Request, engine: Idempotency<Request, unknown>): Promise<Uint8Array> {
  const body = await readBody(req, engine);
  // Parsers mounted later then skip the consumed stream instead of waiting on it.
  Object.assign(req, { body, _body: true });
  return body;
}
