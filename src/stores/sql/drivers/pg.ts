import { createHash } from 'node:crypto';
import pg from 'pg';
import { ConfigError } from '../../../core/contract/index.js';
import { timerMs } from '../../../core/options/index.js';
import {
  databaseErrorCode,
  type SqlDriver,
  type SqlResult,
  type SqlStatement,
  type StatementBound,
} from '../driver.js';

const MISSING_PREPARED_STATEMENT = '26000';
const DUPLICATE_PREPARED_STATEMENT = '42P05';

/**
 * The SQL-level prepared statements each connection holds, shared by every driver in the process
 * (two stores of one table on one pool would otherwise prepare the same name twice).
 */
const preparedOn = new WeakMap<pg.ClientBase, Set<string>>();

/** What the `pg` driver may do on its pool's connections. */
export interface PgDriverOptions {
  /**
   * Prepare the statements that take values (`pg`'s named statements, SQL `PREPARE` for those
   * sent with a BEGIN or a COMMIT): a session that keeps them. Off behind a transaction pooler.
   */
  prepared: boolean;
  /** LISTEN on a connection of its own: a session that keeps it. Off behind a transaction pooler. */
  listen: boolean;
  /** How long opening the listening connection may take. */
  connectTimeoutMs: number;
}

/** The `pg` driver: the SQL store's seam over a `pg.Pool`, with what only `pg` can do. */
export interface PgDriver extends SqlDriver<pg.PoolClient> {
  /** Ends the listening connection; the pool stays its owner's. */
  close(): Promise<void>;
}

/** Where a transaction `transaction()` handed out stands. */
interface Transaction {
  /** BEGIN sent: it rides with the transaction's first statement. */
  begun: boolean;
  /** COMMIT sent with a statement (`commitWith`). */
  ended: boolean;
  /** The connection failed: it is discarded, never given back to the pool. */
  broken: Error | undefined;
}

/**
 * A SQL driver over a `pg` pool: statements with values run prepared (named per text, so two
 * tables' never share one), a transaction is a `PoolClient` whose BEGIN rides with its first
 * statement, the claim's statements go in one round trip (`pipelineIn`) and the saved answer with
 * the COMMIT (`commitWith`), and waits hear NOTIFY on one listening connection.
 *
 * The BEGIN goes out with the first statement sent through the driver (`queryIn`, `pipelineIn`),
 * which the SQL store always sends before the work gets `tx` (the claim, a phase's lock, the
 * migration's lock): a caller that queried `tx` itself first would run that query in autocommit.
 * That is why the driver is the `pg` store's and not exported on its own.
 */
export function pgDriver(pool: pg.Pool, options: PgDriverOptions): PgDriver {
  const transactions = new WeakMap<pg.PoolClient, Transaction>();
  const names = new Map<string, string>();
  /** A statement's name, from its text: `pg`'s protocol-level and SQL `PREPARE` share one namespace. */
  function nameOf(text: string, kind: 'q' | 'p'): string {
    let hash = names.get(text);
    if (hash === undefined) {
      hash = createHash('sha1').update(text).digest('hex').slice(0, 20);
      names.set(text, hash);
    }
    return `retrysafe_${kind}${hash}`;
  }

  /** A statement's query config: named (prepared by `pg` once per connection) when it takes values. */
  function configOf(text: string, params: readonly unknown[]): pg.QueryConfig {
    const values = params as unknown[];
    return options.prepared && values.length > 0
      ? { name: nameOf(text, 'q'), text, values }
      : { text, values };
  }

  /**
   * `statement` as one statement of a multi-statement simple query, which takes no parameters:
   * `EXECUTE` of its SQL-level prepared statement, or its text with each `$n` a literal.
   */
  function inline({ text, values }: SqlStatement, client: pg.PoolClient): string {
    if (!values) return text;
    const name = nameOf(text, 'p');
    if (preparedOn.get(client)?.has(name)) return `EXECUTE ${name}(${values.map(literal).join(', ')})`;
    return text.replace(/\$(\d+)/g, (_, n: string) => literal(values[Number(n) - 1]));
  }

  function stateOf(client: pg.PoolClient): Transaction {
    const state = transactions.get(client);
    if (!state) throw new Error('pgDriver: not a transaction this driver opened');
    return state;
  }

  /** A query on a transaction's client; a failure without SQLSTATE (a lost connection, a timeout) breaks it. */
  async function send(client: pg.PoolClient, state: Transaction, query: string | pg.QueryConfig) {
    try {
      return await client.query(query as pg.QueryConfig);
    } catch (error) {
      if (databaseErrorCode(error) === undefined) state.broken ??= error as Error;
      throw error;
    }
  }

  /** A client of the pool, heard from pg's own callback (see `transaction`). */
  function connect(onError: (error: Error) => void): Promise<pg.PoolClient> {
    return new Promise((resolve, reject) => {
      pool.connect((error, client) => {
        if (error || !client) return reject(pgbouncerRefusal(error));
        client.on('error', onError);
        resolve(client);
      });
    });
  }

  let listener: Promise<pg.Client> | undefined;
  let closed = false;

  return {
    dialect: 'postgres',
    name: 'postgres',
    errorCode: databaseErrorCode,

    async query<Row>(text: string, params: readonly unknown[]): Promise<SqlResult<Row>> {
      try {
        return resultOf<Row>(await pool.query(configOf(text, params)));
      } catch (error) {
        throw pgbouncerRefusal(error);
      }
    },

    async transaction(work) {
      const state: Transaction = { begun: false, ended: false, broken: undefined };
      // Listening from pg's own callback, not after `await pool.connect()`: a backend terminated
      // just after startup sends its FATAL in the same read as ReadyForQuery, and pg emits it on
      // the client in the tick it hands the client out, before an awaiting caller resumes; unheard,
      // it would kill the process. Between our queries it is heard the same way.
      const onError = (error: Error) => {
        state.broken ??= error;
      };
      const client = await connect(onError);
      transactions.set(client, state);
      const release = (failed?: Error) => {
        transactions.delete(client);
        client.off('error', onError);
        client.release(failed ?? state.broken);
      };
      let result: Awaited<ReturnType<typeof work>>;
      try {
        result = await work(client);
        if (state.begun && !state.ended) await send(client, state, 'COMMIT');
      } catch (error) {
        if (state.begun && !state.ended && !state.broken) {
          // Sent and not waited for, so an answer that wrote nothing (a replay) comes after one
          // round trip; the client goes back to the pool once it is rolled back, or is dropped.
          client.query('ROLLBACK').then(() => release(), release);
        } else release();
        throw error;
      }
      release();
      return result;
    },

    async queryIn<Row>(
      client: pg.PoolClient,
      text: string,
      params: readonly unknown[],
      bound?: StatementBound,
    ) {
      const state = stateOf(client);
      if (!state.begun) {
        state.begun = true;
        await send(client, state, 'BEGIN');
      }
      const config = configOf(text, params);
      // Past it the query fails with no SQLSTATE, and `send` has the connection discarded.
      if (bound) (config as { query_timeout?: number }).query_timeout = timerMs(bound.timeoutMs);
      return resultOf<Row>(await send(client, state, config));
    },

    async pipelineIn(client, statements, timeoutMs) {
      const state = stateOf(client);
      for (let attempt = 1; ; attempt++) {
        const begins = !state.begun;
        const texts = statements.map((statement) => inline(statement, client));
        if (begins) texts.unshift('BEGIN');
        state.begun = true;
        try {
          // The client-side guard, for a network that stopped answering: the connection is then
          // discarded, and nothing commits without our COMMIT.
          const answered = await send(client, state, {
            text: texts.join(';\n'),
            query_timeout: timerMs(timeoutMs),
          } as pg.QueryConfig);
          const results = (Array.isArray(answered) ? answered : [answered]).map((one) =>
            resultOf<Record<string, unknown>>(one),
          );
          return begins ? results.slice(1) : results;
        } catch (error) {
          // DISCARD ALL or DEALLOCATE (the application, a pooler) dropped our statements: roll
          // back and send the same again, once, with literals; the next transaction prepares anew.
          if (!begins || attempt > 1 || databaseErrorCode(error) !== MISSING_PREPARED_STATEMENT) throw error;
          preparedOn.delete(client);
          await send(client, state, 'ROLLBACK');
          state.begun = false;
        }
      }
    },

    ...(options.prepared && {
      async prepareIn(client: pg.PoolClient, texts: readonly string[], timeoutMs: number) {
        const state = stateOf(client);
        if (state.begun) return;
        const prepared = preparedOn.get(client) ?? new Set<string>();
        preparedOn.set(client, prepared);
        for (const text of texts) {
          const name = nameOf(text, 'p');
          if (prepared.has(name)) continue;
          try {
            // Preparing waits on a lock of the table as the statement would: bounded (the SETs
            // share the query's implicit transaction, so a timeout undoes them too).
            await send(
              client,
              state,
              `SET statement_timeout = ${timerMs(timeoutMs)}; PREPARE ${name} AS ${text}; SET statement_timeout TO DEFAULT`,
            );
          } catch (error) {
            // Another copy of this module (one per package format, say) prepared it on this connection.
            if (databaseErrorCode(error) !== DUPLICATE_PREPARED_STATEMENT) throw error;
          }
          prepared.add(name);
        }
      },
    }),

    async commitWith<Row>(client: pg.PoolClient, text: string, params: readonly unknown[]) {
      const state = stateOf(client);
      const texts = [inline({ text, values: params }, client), 'COMMIT'];
      if (!state.begun) texts.unshift('BEGIN');
      state.begun = true;
      const answered = (await send(client, state, texts.join(';\n'))) as unknown as pg.QueryResult[];
      state.ended = true;
      return resultOf<Row>(answered[answered.length - 2]!);
    },

    ...(options.listen && {
      listen(channel: string, wake: (payload: string) => void) {
        if (listener || closed) return;
        const client = new pg.Client({ ...pool.options, connectionTimeoutMillis: options.connectTimeoutMs });
        let dropped = false;
        const drop = () => {
          if (dropped) return;
          dropped = true;
          if (current === listener) listener = undefined;
          client.removeAllListeners('notification');
          client.end().catch(() => {});
        };
        client.on('error', drop);
        client.on('end', drop);
        client.on('notification', (message) => {
          if (message.channel === channel && message.payload) wake(message.payload);
        });
        const current = (async () => {
          await client.connect();
          await client.query(`LISTEN "${channel}"`);
          return client;
        })();
        listener = current;
        // Until the listener is up (or after it drops), waits poll.
        current.catch(drop);
      },
    }),

    async close() {
      closed = true;
      const current = listener;
      listener = undefined;
      if (current) await current.then((client) => client.end()).catch(() => {});
    },
  };
}

function resultOf<Row>(result: pg.QueryResult): SqlResult<Row> {
  return { rows: result.rows as Row[], affected: result.command === 'SELECT' ? 0 : (result.rowCount ?? 0) };
}

/** A value as a SQL literal, for a statement sent with others in one simple query. */
function literal(value: unknown): string {
  if (value === null || value === undefined) return 'NULL';
  if (value instanceof Uint8Array) {
    return pg.escapeLiteral(
      `\\x${Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString('hex')}`,
    );
  }
  return pg.escapeLiteral(String(value));
}

/**
 * PgBouncer refuses a connection whose startup packet sets what it does not know (the store's own
 * pool sets `statement_timeout` and `options`): said as a ConfigError naming the option that avoids it.
 */
function pgbouncerRefusal(error: unknown): unknown {
  const message = (error as Error | undefined)?.message ?? '';
  if (!message.startsWith('unsupported startup parameter')) return error;
  return new ConfigError(
    `postgresStore: the server refused the connection's startup parameters (${message}), as PgBouncer does: behind PgBouncer pass \`pooling: 'transaction'\` (or 'session' with ignore_startup_parameters in its config), and set no \`options\` or \`statement_timeout\` on a pool of your own`,
    { cause: error },
  );
}
