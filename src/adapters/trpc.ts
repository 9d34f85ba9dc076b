import { TRPCError, type TRPCMiddlewareFunction } from '@trpc/server';
import { ConfigError, ErrorCode, isIdempotencyError, type RegisteredTx } from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import {
  type HeaderGetter,
  type MutationIdempotencyOptions,
  mutationGuard,
  mutationMessage,
} from './kit/mutation.js';

/** Options of `retrysafe/trpc`'s `idempotency`: `idempotent()`'s, plus where the key and headers are. */
export interface TrpcIdempotencyOptions<Ctx = any, Tx = RegisteredTx>
  extends MutationIdempotencyOptions<Ctx, Tx> {
  /**
   * Take the key from this field of the mutation's input (as the client sent it) instead of the
   * `Idempotency-Key` header: a key per call, also inside a batch.
   * @default undefined (the header)
   * @example inputField: 'idempotencyKey'
   */
  inputField?: string;
  /**
   * The request's headers, from your context: a Web `Headers` (fetch adapter) or node's
   * `IncomingHttpHeaders` (standalone, Express, Fastify). A call without headers (a server-side
   * caller) has no key.
   * @default (ctx) => ctx.req?.headers, for a `createContext` that returns `{ req }`
   * @example headers: (ctx) => ctx.request.headers
   */
  headers?: (ctx: Ctx) => Headers | Record<string, string | string[] | undefined> | undefined;
}

/** What the middleware adds to a guarded mutation's `ctx`. */
export interface IdempotencyCtx<Tx = RegisteredTx> {
  /** Set on mutations run under a key: `key`, `scope`, `downstreamKey(purpose)`, `tx` in atomic mode. */
  idempotency: IdempotencyContext<Tx> | undefined;
}

const TRPC_NAMES = ['inputField', 'headers'];

/** tRPC's error code for each status an idempotency refusal carries. */
const TRPC_CODES: Record<number, TRPCError['code']> = {
  400: 'BAD_REQUEST',
  409: 'CONFLICT',
  500: 'INTERNAL_SERVER_ERROR',
  503: 'SERVICE_UNAVAILABLE',
};

function defaultHeaders(ctx: unknown) {
  return (ctx as { req?: { headers?: Headers | Record<string, string | string[] | undefined> } } | undefined)
    ?.req?.headers;
}

function getterOf(headers: Headers | Record<string, string | string[] | undefined> | undefined) {
  if (headers === undefined || headers === null) return undefined;
  if (typeof (headers as Headers).get === 'function') return (name: string) => (headers as Headers).get(name);
  return ((name: string) => (headers as Record<string, string | string[] | undefined>)[name]) as HeaderGetter;
}

/** A refusal as tRPC answers it, the engine's error kept as `cause` for an `errorFormatter`. */
function trpcError(error: unknown): unknown {
  if (!isIdempotencyError(error)) return error;
  // Not 409: the same call later is the right retry, and 409 says "never with this key".
  const code = error.code === ErrorCode.inProgress ? 'TOO_MANY_REQUESTS' : TRPC_CODES[error.status];
  return new TRPCError({
    code: code ?? 'INTERNAL_SERVER_ERROR',
    message: mutationMessage(error),
    cause: error,
  });
}

/**
 * tRPC v11 middleware making mutations idempotent: `t.procedure.use(idempotency(options))`. A
 * mutation with a key (the `Idempotency-Key` header, or `inputField` of its input) runs at most
 * once per caller and key; every later call of the key gets the first call's result (its JSON)
 * without running the resolver. Another procedure or input under a used key is a `CONFLICT`
 * (409); a call while the first is still running waits for it, then is `TOO_MANY_REQUESTS`
 * (429: retry with the same key); a resolver's error frees the key. Queries and subscriptions
 * pass through. The resolver finds `ctx.idempotency` (`key`, `downstreamKey(purpose)`, `tx`).
 * The fingerprint is the procedure's path and its raw input; the result must be JSON (a
 * transformer's Date or Map is refused, `result_not_storable`, and the key freed).
 * A header key names one mutation: in a batch (`httpBatchLink`) the mutations after the first are
 * refused (`BAD_REQUEST`); send guarded mutations with `httpLink`, or name the key in the input.
 * @example
 * const createOrder = t.procedure
 *   .use(idempotency({ store: memoryStore() }))
 *   .input(z.object({ item: z.string() }))
 *   .mutation(({ input }) => orders.add(input));
 */
export function idempotency<Ctx = any, Tx = RegisteredTx>(
  options: TrpcIdempotencyOptions<Ctx, Tx>,
): TRPCMiddlewareFunction<Ctx, any, object, IdempotencyCtx<Tx>, unknown> {
  const guard = mutationGuard<Ctx, Tx>('trpc idempotency()', options, TRPC_NAMES);
  const { inputField, headers: headersOf = defaultHeaders } = options;
  if (inputField !== undefined && (typeof inputField !== 'string' || inputField === '')) {
    throw new ConfigError('retrysafe: trpc idempotency() option `inputField` must be a non-empty string');
  }
  if (typeof headersOf !== 'function') {
    throw new ConfigError('retrysafe: trpc idempotency() option `headers` must be a function');
  }

  return async function idempotency(opts) {
    if (opts.type !== 'mutation') return opts.next({ ctx: { idempotency: undefined } });
    try {
      const headers = getterOf(headersOf(opts.ctx as Ctx));
      const input = await opts.getRawInput();
      let key: string | undefined;
      if (inputField !== undefined) {
        const value = (input as Record<string, unknown> | undefined)?.[inputField];
        key = value === undefined ? undefined : guard.namedKey(value, `the input's \`${inputField}\``);
      } else {
        key = guard.headerKey(headers);
        if (key !== undefined && opts.batchIndex > 0) {
          throw new TRPCError({
            code: 'BAD_REQUEST',
            message:
              'One Idempotency-Key names one mutation, and this batch holds several: send each guarded mutation on its own request, or name its key in the input.',
          });
        }
      }
      if (key === undefined) {
        if (guard.required) throw guard.missing();
        return await opts.next({ ctx: { idempotency: undefined } });
      }
      const operation = input === undefined ? { path: opts.path } : { path: opts.path, input };
      const data = await guard.run(opts.ctx as Ctx, headers, key, operation, async (idempotency) => {
        const result = await opts.next({ ctx: { idempotency } });
        if (!result.ok) throw result.error;
        return result.data;
      });
      // The first call's result or a replay of it, which never reached the resolver: answered as
      // the resolver's own result is (tRPC checks a result's `marker` by type only).
      return { ok: true as const, data, ctx: opts.ctx, marker: 'middlewareMarker' as never };
    } catch (error) {
      throw trpcError(error);
    }
  };
}
