import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import {
  createIdempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  isIdempotencyError,
  type RegisteredTx,
} from '../core/index.js';
import {
  capture,
  closeAfterDrain,
  engineOptionsOf,
  internalError,
  keyHeaderOf,
  readBody,
  resetHeaders,
  send,
  sendAnswer,
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

/** Options of `retrysafe/node`'s `idempotency`: the engine's options over node:http requests. */
export type NodeIdempotencyOptions<Tx = RegisteredTx> = IdempotencyOptions<IncomingMessage, Tx>;

/**
 * Guards node:http handlers with Idempotency-Key. The wrapper reads each request body (413 past
 * `maxBodyBytes`) into `req.body`, captures the guarded handler's response, saves it, and
 * replays it to retries. The handler's own errors become a 500 after the key is released.
 * @example
 * const guard = idempotency({ store: sqliteStore({ filename: 'app.db' }) });
 * http.createServer(guard(async (req, res, idem) => { res.writeHead(201).end('made') })).listen(8080);
 */
export function idempotency<Tx = RegisteredTx>(options: NodeIdempotencyOptions<Tx>) {
  const engine = createIdempotency<IncomingMessage, Tx>(engineOptionsOf('node idempotency()', options));
  return function wrap(handler: NodeHandler<Tx>) {
    return async function idempotentHandler(req: IncomingMessage, res: ServerResponse): Promise<void> {
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
            return capture(engine, res, () => handler(request, res, ctx));
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
            if (before) resetHeaders(res, before);
            return send(res, engine.render(outcome.error));
        }
      } catch (error) {
        if (before && !res.headersSent) resetHeaders(res, before);
        internalError(res, error);
      }
    };
  };
}
