import type { Context, MiddlewareHandler } from 'hono';
import { HTTPException } from 'hono/http-exception';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import { createIdempotency, type Idempotency } from '../core/adapter.js';
import type { RegisteredTx } from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import type { IdempotencyOptions } from '../core/options/index.js';
import {
  captureWebResponse,
  dropUnreadBody,
  engineOptionsOf,
  type FetchListener,
  fetchDispatch,
  pathAndQuery,
  RESUME_HEADER,
  type ResumesThrough,
  resumeVia,
  takeResume,
  toResponse,
} from './kit/index.js';

/** Options of `retrysafe/hono`'s `idempotency`: the engine's over Hono's `Context`. */
export type HonoIdempotencyOptions<Tx = RegisteredTx> = IdempotencyOptions<Context, Tx>;

/** The context variables the middleware sets: `c.get('idempotency')`. */
export interface IdempotencyVariables<Tx = RegisteredTx> {
  /** Set on requests guarded by an Idempotency-Key; `undefined` otherwise. */
  idempotency: IdempotencyContext<Tx> | undefined;
}

// As Hono's own middleware do: `c.get('idempotency')` is typed in every handler, also those of
// an `app.use` whose middleware the route's type does not name.
declare module 'hono' {
  interface ContextVariableMap extends IdempotencyVariables {}
}

/**
 * Hono 4 middleware guarding POST/PATCH routes with Idempotency-Key, on @hono/node-server or any
 * Web-standard runtime. Mount it per path for per-route options. The guarded handler finds
 * `c.get('idempotency')`; the Response it returns is captured, saved, and replayed to retries
 * byte for byte. A body larger than `maxResponseBytes` is streamed through in lease mode, not
 * saved, and the key released. An error the handler throws releases the key and is answered by
 * `app.onError` as usual. Engine errors (400, 409/422, 413, 503) are thrown as an
 * `HTTPException` carrying the JSON response (or `onError`'s rendering): Hono's default error
 * handler sends it as is, a custom `app.onError` gets it back with `err.getResponse()` and finds
 * the `IdempotencyError` in `err.cause`. The request body is read with `c.req.arrayBuffer()`, so
 * handlers can still call `c.req.json()`; a body without Content-Length is measured after reading
 * (add `hono/body-limit` in front to cap chunked uploads while they stream).
 * @example
 * app.use('/orders', idempotency({ store, required: true }));
 * app.post('/orders', (c) => c.json({ id, key: c.get('idempotency')?.key }, 201, { location: `/orders/${id}` }));
 */
export function idempotency<Tx = RegisteredTx>(
  options: HonoIdempotencyOptions<Tx>,
): MiddlewareHandler<{ Variables: IdempotencyVariables<Tx> }> & ResumesThrough<{ fetch: FetchListener }> {
  const engine = createIdempotency<Context, Tx>(engineOptionsOf('hono idempotency()', options));

  const middleware: MiddlewareHandler<{ Variables: IdempotencyVariables<Tx> }> = async function idempotency(
    c,
    next,
  ) {
    const resume = takeResume(c.req.header(RESUME_HEADER));
    if (resume !== undefined) {
      c.set('idempotency', resume.ctx as IdempotencyContext<Tx>);
      await next();
      // app.onError answered the handler's error: the resume failed, that answer stands.
      if (c.error) return resume.settle(Promise.reject(c.error));
      const running = captureWebResponse(resume.collect(), c.res, {});
      resume.settle(running.then((captured) => captured.response));
      c.res = (await running).send;
      return;
    }
    let sent: Response | undefined;
    let outcome: Awaited<ReturnType<typeof engine.handle>>;
    try {
      outcome = await engine.handle(
        {
          method: c.req.method,
          path: pathAndQuery(c.req.url),
          keyHeader: (engine.keyHeader && c.req.raw.headers.get(engine.keyHeader)) ?? undefined,
          contentType: c.req.header('content-type'),
          acceptEncoding: c.req.header('accept-encoding'),
          authorization: c.req.raw.headers.get('authorization') ?? undefined,
          readBody: () => bodyOf(c, engine),
          raw: c,
        },
        async (ctx) => {
          c.set('idempotency', ctx);
          await next();
          // Hono hands a handler's error to app.onError before we get back here; rethrowing it
          // tells the engine to release the key.
          if (c.error) throw c.error;
          const captured = await captureWebResponse(engine.collect(), c.res, engine.answerHeaders(ctx.key));
          sent = captured.send;
          return captured.response;
        },
      );
    } catch (error) {
      // app.onError already answered the handler's error; that answer stands.
      if (error === c.error) return;
      throw error;
    }
    switch (outcome.kind) {
      case 'pass':
        c.set('idempotency', undefined);
        return next();
      case 'executed':
        c.res = sent;
        return;
      case 'replayed':
        // After a handler whose lease was lost, Hono would keep its response (and merge its
        // headers into ours): drop it first.
        if (sent !== undefined) {
          c.res = undefined;
          c.res = toResponse(outcome.response);
          return;
        }
        return toResponse(outcome.response);
      case 'rejected': {
        // After the handler ran (atomic mode could not commit), none of its headers may leak
        // into the error response: Hono would merge them into it.
        if (sent !== undefined) c.res = undefined;
        // Refused before the body was read (a bad key, a declared length past the limit): the
        // rest is dropped first, or @hono/node-server may close on it and reset the client.
        await dropUnreadBody(c.req.raw);
        const rendered = engine.render(outcome.error);
        throw new HTTPException(rendered.status as ContentfulStatusCode, {
          res: toResponse(rendered),
          message: outcome.error.message,
          cause: outcome.error,
        });
      }
    }
  };
  return Object.assign(middleware, {
    resumeThrough: (app: { fetch: FetchListener }) =>
      resumeVia(
        engine,
        fetchDispatch((request) => app.fetch(request)),
      ),
  });
}

async function bodyOf(c: Context, engine: Idempotency<Context, unknown>): Promise<Uint8Array> {
  const declared = Number(c.req.header('content-length'));
  if (declared > engine.maxBodyBytes) throw engine.bodyTooLarge();
  const body = new Uint8Array(await c.req.arrayBuffer());
  if (body.byteLength > engine.maxBodyBytes) throw engine.bodyTooLarge();
  return body;
}
