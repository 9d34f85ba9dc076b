import { ConfigError } from './contract/errors.js';

/** What the type checker says of a call of the root's `idempotency`: short enough to be shown whole. */
type ImportItFromYourFrameworksEntry =
  "idempotency() is not in 'retrysafe': import it from your framework's entry, e.g. 'retrysafe/express' (README: Quick start)";

/**
 * Not the middleware: `idempotency()` comes from your framework's entry, e.g.
 * `import { idempotency } from 'retrysafe/express'` (also `retrysafe/fastify`, `retrysafe/hono`,
 * `retrysafe/koa`, `retrysafe/node`, `retrysafe/fetch`, `retrysafe/trpc`; NestJS:
 * `RetrysafeModule` from `retrysafe/nestjs`; Next.js server actions: `idempotentAction` from
 * `retrysafe/next`). This stand-in only says so: a call does not compile (its parameter's type is
 * the hint) and throws a `ConfigError` naming every entry.
 * @deprecated `idempotency` is not exported by `retrysafe`: import it from your framework's entry,
 * e.g. `retrysafe/express` (see the README's Quick start).
 */
export function idempotency(_hint: ImportItFromYourFrameworksEntry): never {
  throw new ConfigError(
    "retrysafe: idempotency() is not in 'retrysafe'; import it from your framework's entry: " +
      "'retrysafe/express', 'retrysafe/fastify', 'retrysafe/hono', 'retrysafe/koa', 'retrysafe/node', " +
      "'retrysafe/fetch' or 'retrysafe/trpc' (NestJS: RetrysafeModule from 'retrysafe/nestjs'; " +
      "Next.js server actions: idempotentAction from 'retrysafe/next'; GraphQL: useIdempotency from " +
      "'retrysafe/graphql'). The README's Quick start shows each: https://github.com/retrysafe/retrysafe#quick-start",
  );
}
