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

/** Options of `retrysafe/fetch`'s `idempotency`: the engine's over Web-standard `Request`s. */
export type FetchIdempotencyOptions<Tx = RegisteredTx> = IdempotencyOptions<Request, Tx>;

/** A Web-standard handler: Next.js route handlers, `Bun.serve`, `Deno.serve`, React Router actions… */
export type FetchHandler<R extends Request = Request, Rest extends unknown[] = unknown[]> = (
  request: R,
  ...rest: Rest
) => Response | Promise<Response>;

// Keyed by the very Request the handler gets, so a handler finds its context whatever the
// runtime hands it besides (Next.js' route context, Bun's server, Deno's info).
const contexts = new WeakMap<Request, IdempotencyContext<unknown>>();

/**
 * The idempotency context of a request a guarded handler is answering: set for requests guarded
 * by an Idempotency-Key; `undefined` for a method that is not guarded or a request without a key
 * on an optional route.
 */
export function idempotencyOf<Tx = RegisteredTx>(request: Request): IdempotencyContext<Tx> | undefined {
  return contexts.get(request) as IdempotencyContext<Tx> | undefined;
}

/**
 * Guards Web-standard `(request, ...rest) => Response` handlers with Idempotency-Key, on any
 * runtime with `Request` and `Response`: Node (Next.js, @hono/node-server's `serve`), Bun, Deno,
 * workers. `idempotency(options)` returns `guard`; `guard(handler)` returns a handler of the same
 * shape. The body is fingerprinted from a clone, so the handler reads `request.json()` as usual
 * (413 past `maxBodyBytes`, before the handler runs). The Response the handler returns is
 * captured, saved, and replayed to retries as a fresh Response; past `maxResponseBytes` it is
 * streamed through in lease mode, not saved, and the key released. Engine errors (400, 409/422,
 * 413, 503) are answered as Responses (JSON, or `onError`'s rendering). An error the handler
 * throws releases the key and is thrown on, to the runtime's own error path.
 * @example
 * const guard = idempotency({ store: memoryStore(), required: true });
 * export const POST = guard(async (request) => {
 *   const order = await createOrder(await request.json(), idempotencyOf(request)?.key);
 *   return Response.json(order, { status: 201 });
 * });
 */
export function idempotency<Tx = RegisteredTx>(options: FetchIdempotencyOptions<Tx>) {
  const engine = createIdempotency<Request, Tx>(engineOptionsOf('fetch idempotency()', options));
  function guard<R extends Request, Rest extends unknown[]>(
    handler: FetchHandler<R, Rest>,
  ): (request: R, ...rest: Rest) => Promise<Response> {
    return async function idempotentHandler(request: R, ...rest: Rest): Promise<Response> {
      const resume = takeResume(request.headers.get(RESUME_HEADER));
      if (resume !== undefined) {
        contexts.set(request, resume.ctx);
        const running = (async () =>
          captureWebResponse(resume.collect(), await handler(request, ...rest), {}))();
        resume.settle(running.then((captured) => captured.response));
        return (await running).send;
      }
      let sent: Response | undefined;
      const outcome = await engine.handle(
        {
          method: request.method,
          path: pathAndQuery(request.url),
          keyHeader: (engine.keyHeader && request.headers.get(engine.keyHeader)) ?? undefined,
          contentType: request.headers.get('content-type') ?? undefined,
          acceptEncoding: request.headers.get('accept-encoding') ?? undefined,
          authorization: request.headers.get('authorization') ?? undefined,
          readBody: () => bodyOf(request, engine),
          raw: request,
        },
        async (ctx) => {
          contexts.set(request, ctx);
          const captured = await captureWebResponse(
            engine.collect(),
            await handler(request, ...rest),
            engine.answerHeaders(ctx.key),
          );
          sent = captured.send;
          return captured.response;
        },
      );
      switch (outcome.kind) {
        case 'pass':
          return handler(request, ...rest);
        case 'executed':
          return sent as Response;
        case 'replayed':
          // After a handler whose lease was lost, its answer goes unsent: let go of its stream.
          await sent?.body?.cancel();
          return toResponse(outcome.response);
        case 'rejected':
          // Atomic mode could not commit what the handler answered: none of it may reach the client.
          await sent?.body?.cancel();
          // Refused before the body was read (a bad key, one too large): the rest is dropped first.
          await dropUnreadBody(request);
          return toResponse(engine.render(outcome.error));
      }
    };
  }
  const resumes: ResumesThrough<FetchListener> = {
    // The guarded handler itself, or a router in front of several.
    resumeThrough: (handler) => resumeVia(engine, fetchDispatch(handler)),
  };
  return Object.assign(guard, resumes);
}

/**
 * The body's bytes, read from a clone: the handler's own Request keeps its body unread. Stops
 * reading past `maxBodyBytes`, with or without a Content-Length; the 413 then goes out once the
 * rest is dropped (`dropUnreadBody`).
 */
async function bodyOf(request: Request, engine: Idempotency<Request, unknown>): Promise<Uint8Array> {
  if (request.body === null) return new Uint8Array(0);
  if (!(Number(request.headers.get('content-length')) > engine.maxBodyBytes)) {
    const body = await readUpTo(
      (request.clone().body as ReadableStream<Uint8Array>).getReader(),
      engine.maxBodyBytes,
    );
    if (body !== undefined) return body;
  }
  throw engine.bodyTooLarge();
}

/** The whole stream's bytes, or `undefined` (and the stream cancelled) past `limit`. */
async function readUpTo(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  limit: number,
): Promise<Uint8Array | undefined> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      // Not awaited: cancelling one branch of a clone settles only once the other is cancelled too.
      void reader.cancel();
      return undefined;
    }
    chunks.push(value);
  }
  if (chunks.length === 1) return chunks[0] as Uint8Array;
  const body = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    body.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return body;
}
