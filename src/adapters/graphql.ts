import {
  defaultFieldResolver,
  type FieldNode,
  type FragmentDefinitionNode,
  GraphQLError,
  type GraphQLFieldResolver,
  type GraphQLResolveInfo,
  type GraphQLSchema,
  getDirectiveValues,
  Kind,
  type OperationDefinitionNode,
  type SelectionSetNode,
} from 'graphql';
import {
  ConfigError,
  type IdempotencyError,
  isIdempotencyError,
  type RegisteredTx,
} from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import {
  type HeaderGetter,
  type MutationGuard,
  type MutationIdempotencyOptions,
  mutationGuard,
  mutationMessage,
} from './kit/mutation.js';

/** Options of `retrysafe/graphql`'s plugins: `idempotent()`'s, plus which mutations to guard. */
export interface GraphqlIdempotencyOptions<Context = any, Tx = RegisteredTx>
  extends MutationIdempotencyOptions<Context, Tx> {
  /**
   * The fields of the Mutation type to guard; a name the schema lacks fails when the server starts.
   * @default every field of the Mutation type
   * @example mutations: ['createOrder', 'refundCreate']
   */
  mutations?: readonly string[];
}

/**
 * The `@idempotent(key:)` directive, in the style Shopify's Admin API made mandatory: add it to
 * your type definitions to let a client name a mutation's key in the document,
 * `refundCreate(input: $input) @idempotent(key: "4f5b…")`. It takes precedence over the header.
 */
export const idempotentDirective = 'directive @idempotent(key: String!) on FIELD';

/**
 * What `useIdempotency` returns: an envelop plugin, as Yoga's `plugins` take it (typed here so
 * that the module needs no types of envelop's).
 */
export interface EnvelopIdempotencyPlugin {
  /** Guards the Mutation fields of each schema the server is given. */
  onSchemaChange(payload: { schema: unknown }): void;
  /** Guards the schema of an execution, should it come without an `onSchemaChange`. */
  onExecute(payload: { args: { schema: GraphQLSchema } }): void;
}

/**
 * What `apolloIdempotency` returns: an Apollo Server plugin (typed here so that the module needs
 * no types of Apollo's).
 */
export interface ApolloIdempotencyPlugin<Context> {
  /** Guards the Mutation fields of the server's schema. */
  serverWillStart(service: { schema: GraphQLSchema }): Promise<void>;
  /** Notes the request's headers for the resolvers of its context. */
  requestDidStart(requestContext: {
    request: { http?: { headers: { get(name: string): string | undefined } } };
    contextValue: Context;
    schema: GraphQLSchema;
  }): Promise<void>;
}

const GRAPHQL_NAMES = ['mutations'];

// A resolver's idempotency context, by the `info` graphql-js hands that one field's resolver.
const contexts = new WeakMap<GraphQLResolveInfo, IdempotencyContext<unknown>>();

/**
 * The idempotency context of the guarded mutation whose resolver got `info`: `key`, `scope`,
 * `downstreamKey(purpose)`, `tx` in atomic mode; `undefined` when the mutation ran without a key.
 */
export function idempotencyOf<Tx = RegisteredTx>(
  info: GraphQLResolveInfo,
): IdempotencyContext<Tx> | undefined {
  return contexts.get(info) as IdempotencyContext<Tx> | undefined;
}

/** A refusal as a GraphQL error: `extensions.code` is the engine's code in capitals (`KEY_CONFLICT`). */
function graphqlError(error: IdempotencyError): GraphQLError {
  // No `originalError`: Yoga masks an error that carries one as "Unexpected error.".
  return new GraphQLError(mutationMessage(error), {
    extensions: { code: error.code.toUpperCase() },
  });
}

/** The plugins' shared half: wraps the chosen Mutation fields' resolvers of each schema once. */
function schemaGuard<Context, Tx>(
  label: string,
  options: GraphqlIdempotencyOptions<Context, Tx>,
  headersOf: (context: Context) => HeaderGetter | undefined,
) {
  const guard = mutationGuard<Context, Tx>(label, options, GRAPHQL_NAMES);
  const { mutations } = options;
  if (
    mutations !== undefined &&
    !(Array.isArray(mutations) && mutations.every((m) => typeof m === 'string'))
  ) {
    throw new ConfigError(`retrysafe: ${label} option \`mutations\` must be an array of field names`);
  }
  const guarded = new WeakSet<GraphQLSchema>();

  return function guardSchema(schema: GraphQLSchema): void {
    if (guarded.has(schema)) return;
    guarded.add(schema);
    const fields = schema.getMutationType()?.getFields() ?? {};
    const names = mutations ?? Object.keys(fields);
    const missing = names.filter((name) => fields[name] === undefined);
    if (missing.length > 0) {
      throw new ConfigError(
        `retrysafe: ${label} option \`mutations\` names no field of the Mutation type: ${missing.join(', ')}`,
      );
    }
    const chosen = new Set(names);
    for (const name of names) {
      const field = fields[name]!;
      field.resolve = guardedResolver(guard, field.resolve ?? defaultFieldResolver, headersOf, chosen);
    }
  };
}

function guardedResolver<Context, Tx>(
  guard: MutationGuard<Context, Tx>,
  resolve: GraphQLFieldResolver<unknown, Context>,
  headersOf: (context: Context) => HeaderGetter | undefined,
  chosen: ReadonlySet<string>,
): GraphQLFieldResolver<unknown, Context> {
  return async function idempotentResolver(source, args, context, info) {
    const headers = headersOf(context);
    try {
      let key = directiveKey(guard, info);
      if (key === undefined) {
        key = guard.headerKey(headers);
        if (key !== undefined && headerKeyedFields(info, chosen) > 1) {
          throw new GraphQLError(
            'One Idempotency-Key names one mutation, and this document holds several guarded ones without @idempotent(key:): none of them ran. Give each its own key with @idempotent(key:), or send them apart.',
            { extensions: { code: 'IDEMPOTENCY_KEY_AMBIGUOUS' } },
          );
        }
      }
      if (key === undefined) {
        if (guard.required) throw guard.missing();
        return await resolve(source, args, context, info);
      }
      return await guard.run(context, headers, key, { field: info.fieldName, args }, (ctx) => {
        contexts.set(info, ctx);
        return resolve(source, args, context, info);
      });
    } catch (error) {
      throw isIdempotencyError(error) ? graphqlError(error) : error;
    }
  };
}

/** The key a field's `@idempotent(key:)` names (variables resolved), when the schema declares it. */
function directiveKey(guard: MutationGuard<unknown, unknown>, info: GraphQLResolveInfo): string | undefined {
  const directive = info.schema.getDirective('idempotent');
  if (!directive) return undefined;
  const values = getDirectiveValues(directive, info.fieldNodes[0]!, info.variableValues);
  return values === undefined ? undefined : guard.namedKey(values.key, 'the @idempotent key');
}

// Counted once per document: every guarded root field of the operation asks.
const headerKeyedCounts = new WeakMap<OperationDefinitionNode, number>();

/**
 * How many root fields of the operation would take the header's key: guarded ones without an
 * `@idempotent` directive, through fragments, whatever their `@skip`/`@include` (a count that
 * cannot depend on variables refuses the same document alike every time).
 */
function headerKeyedFields(info: GraphQLResolveInfo, chosen: ReadonlySet<string>): number {
  let count = headerKeyedCounts.get(info.operation);
  if (count !== undefined) return count;
  count = 0;
  const visit = (set: SelectionSetNode, seen: Set<string>) => {
    for (const selection of set.selections) {
      if (selection.kind === Kind.FIELD) {
        if (chosen.has(selection.name.value) && !hasDirective(selection, 'idempotent')) count! += 1;
      } else if (selection.kind === Kind.INLINE_FRAGMENT) {
        visit(selection.selectionSet, seen);
      } else if (!seen.has(selection.name.value)) {
        seen.add(selection.name.value);
        const fragment: FragmentDefinitionNode | undefined = info.fragments[selection.name.value];
        if (fragment) visit(fragment.selectionSet, seen);
      }
    }
  };
  visit(info.operation.selectionSet, new Set());
  headerKeyedCounts.set(info.operation, count);
  return count;
}

const hasDirective = (field: FieldNode, name: string) =>
  field.directives?.some((directive) => directive.name.value === name) ?? false;

const getterOf = (headers: { get(name: string): string | null | undefined } | undefined) =>
  headers === undefined ? undefined : (name: string) => headers.get(name);

/**
 * An envelop plugin for GraphQL Yoga (or any envelop server) making mutations idempotent:
 * `createYoga({ schema, plugins: [useIdempotency({ store })] })`. A guarded mutation field with a
 * key (its `@idempotent(key:)` directive, else the `Idempotency-Key` header of `context.request`)
 * runs its resolver at most once per caller and key; every later request of the key gets that
 * resolver's result (JSON: plain objects, as a resolver returning database rows gives) and the
 * selection set is resolved on it as usual. Another field or arguments under a used key: an error
 * with `extensions.code` `KEY_CONFLICT`, the resolver not run; one still in progress:
 * `REQUEST_IN_PROGRESS` (retry with the same key); a resolver's error frees the key. A document
 * with two guarded mutations and one header key runs neither (`IDEMPOTENCY_KEY_AMBIGUOUS`).
 * @example
 * const yoga = createYoga({ schema, plugins: [useIdempotency({ store, mutations: ['createOrder'] })] });
 */
export function useIdempotency<Context = any, Tx = RegisteredTx>(
  options: GraphqlIdempotencyOptions<Context, Tx>,
): EnvelopIdempotencyPlugin {
  const guardSchema = schemaGuard<Context, Tx>('graphql useIdempotency()', options, (context) =>
    getterOf((context as { request?: Request } | undefined)?.request?.headers),
  );
  return {
    onSchemaChange({ schema }) {
      guardSchema(schema as GraphQLSchema);
    },
    onExecute({ args }) {
      guardSchema(args.schema);
    },
  };
}

/**
 * The same plugin for Apollo Server 5: `new ApolloServer({ typeDefs, resolvers, plugins:
 * [apolloIdempotency({ store })] })`; the header is read from the HTTP request Apollo received,
 * whatever your `context` function returns.
 * @example
 * const server = new ApolloServer({ schema, plugins: [apolloIdempotency({ store, mutations: ['createOrder'] })] });
 */
export function apolloIdempotency<Context extends object = any, Tx = RegisteredTx>(
  options: GraphqlIdempotencyOptions<Context, Tx>,
): ApolloIdempotencyPlugin<Context> {
  // Apollo hands resolvers your context object, and plugins the request it was built for.
  const headers = new WeakMap<object, HeaderGetter>();
  const guardSchema = schemaGuard<Context, Tx>('graphql apolloIdempotency()', options, (context) =>
    headers.get(context),
  );
  return {
    async serverWillStart({ schema }) {
      guardSchema(schema);
    },
    async requestDidStart({ request, contextValue, schema }) {
      guardSchema(schema);
      const getter = getterOf(request.http?.headers);
      if (getter) headers.set(contextValue, getter);
    },
  };
}
