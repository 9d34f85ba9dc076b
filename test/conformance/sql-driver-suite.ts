import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SqlDriver } from '../../src/stores/sql/driver.js';
import { dropSchemas, uniqueName } from '../support/services.js';

/**
 * An ORM's driver under test, on PostgreSQL. `nested` runs `work` in the ORM's own nested
 * transaction on `tx` (a savepoint the ORM's way): released when `work` resolves, rolled back
 * to when it throws, the throw passed on.
 */
export interface SqlDriverUnderTest<Tx> {
  driver: SqlDriver<Tx>;
  nested(tx: Tx, work: (inner: Tx) => Promise<void>): Promise<void>;
  /** Closes the ORM's connections. */
  close(): Promise<void>;
  /** The ORM reports a SELECT's row count as its `affected` (TypeORM): the store never reads it. */
  selectCountsRows?: boolean;
}

/**
 * What the SQL store asks of a driver (src/stores/sql/driver.ts), checked on PostgreSQL: native
 * `$n` placeholders (one used twice, a `?` in the text), the four parameter kinds and bytes back
 * as bytes, affected counts, commit and rollback the ORM's way, queryIn on the transaction,
 * the ORM's own nesting, and the database's error code through the ORM's wrapping.
 */
export function describeSqlDriverConformance<Tx>(
  name: string,
  open: (schema: string) => Promise<SqlDriverUnderTest<Tx>>,
): void {
  describe(`SQL driver: ${name} (PostgreSQL)`, () => {
    const schema = uniqueName('rs_driver');
    const table = `"${schema}".t`;
    let subject: SqlDriverUnderTest<Tx>;
    let driver: SqlDriver<Tx>;

    beforeAll(async () => {
      subject = await open(schema);
      driver = subject.driver;
      await driver.query(`CREATE SCHEMA "${schema}"`, []);
      await driver.query(`CREATE TABLE ${table} (k text PRIMARY KEY, n int, b bytea)`, []);
    });
    afterAll(async () => {
      await subject?.close();
      await dropSchemas(schema);
    });

    const keys = async (): Promise<string[]> =>
      (await driver.query<{ k: string }>(`SELECT k FROM ${table} ORDER BY k`, [])).rows.map((row) => row.k);
    const clear = () => driver.query(`DELETE FROM ${table}`, []);

    it('speaks the PostgreSQL dialect under its own name', () => {
      expect(driver.dialect).toBe('postgres');
      expect(driver.name).toBe(name);
    });

    it('takes $n placeholders, one used twice, with a ? and ?? in the text', async () => {
      const { rows, affected } = await driver.query<Record<string, unknown>>(
        `SELECT $1::text AS a, $2::int AS b, $1::text AS c, '?' AS q, '??' AS qq, '{"x":1}'::jsonb ? 'x' AS has, $3::text AS d`,
        ['one', 2, null],
      );
      expect(rows).toEqual([{ a: 'one', b: 2, c: 'one', q: '?', qq: '??', has: true, d: null }]);
      expect(affected).toBe(subject.selectCountsRows ? 1 : 0);
    });

    it('answers how many rows an INSERT, UPDATE and DELETE changed', async () => {
      await clear();
      const inserted = await driver.query(`INSERT INTO ${table} (k, n) VALUES ($1, 1), ($2, 2), ($3, 3)`, [
        'a',
        'b',
        'c',
      ]);
      expect(inserted.affected).toBe(3);
      expect((await driver.query(`UPDATE ${table} SET n = n + 10 WHERE n >= $1`, [2])).affected).toBe(2);
      expect((await driver.query(`UPDATE ${table} SET n = 0 WHERE k = $1`, ['none'])).affected).toBe(0);
      const returned = await driver.query<{ k: string }>(
        `DELETE FROM ${table} WHERE n > $1 RETURNING k`,
        [10],
      );
      expect(returned.affected).toBe(2);
      expect(returned.rows.map((row) => row.k).sort()).toEqual(['b', 'c']);
      expect((await driver.query(`DELETE FROM ${table} WHERE k = $1`, ['none'])).affected).toBe(0);
    });

    it('sends bytes and gives them back as bytes, every byte value', async () => {
      await clear();
      const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
      await driver.query(`INSERT INTO ${table} (k, b) VALUES ($1, $2), ($3, $4)`, [
        'u8',
        bytes,
        'buffer',
        Buffer.from(bytes),
      ]);
      const { rows } = await driver.query<{ k: string; b: unknown }>(
        `SELECT k, b FROM ${table} ORDER BY k`,
        [],
      );
      for (const row of rows) {
        expect(row.b, row.k).toBeInstanceOf(Uint8Array);
        expect(Buffer.from(row.b as Uint8Array).equals(Buffer.from(bytes)), row.k).toBe(true);
      }
    });

    it("commits the transaction's statements when work resolves, and answers what it answered", async () => {
      await clear();
      const answer = await driver.transaction(async (tx) => {
        const inserted = await driver.queryIn(tx, `INSERT INTO ${table} (k) VALUES ($1)`, ['kept']);
        expect(inserted.affected).toBe(1);
        // The transaction sees its own write; a statement outside it does not, yet.
        expect((await driver.queryIn<{ k: string }>(tx, `SELECT k FROM ${table}`, [])).rows).toEqual([
          { k: 'kept' },
        ]);
        expect(await keys()).toEqual([]);
        return 'answer';
      });
      expect(answer).toBe('answer');
      expect(await keys()).toEqual(['kept']);
    });

    it('rolls back when work throws, and throws what it threw', async () => {
      await clear();
      const thrown = new Error('work failed');
      const failed = await driver
        .transaction(async (tx) => {
          await driver.queryIn(tx, `INSERT INTO ${table} (k) VALUES ($1)`, ['dropped']);
          throw thrown;
        })
        .catch((error: unknown) => error);
      expect(failed).toBe(thrown);
      expect(await keys()).toEqual([]);
    });

    it("nests the ORM's way: a failed nested transaction undoes only its own writes", async () => {
      await clear();
      await driver.transaction(async (tx) => {
        await driver.queryIn(tx, `INSERT INTO ${table} (k) VALUES ($1)`, ['outer']);
        const failed = await subject
          .nested(tx, async (inner) => {
            await driver.queryIn(inner, `INSERT INTO ${table} (k) VALUES ($1)`, ['inner']);
            throw new Error('inner failed');
          })
          .catch((error: unknown) => error);
        expect(failed).toEqual(new Error('inner failed'));
        await subject.nested(tx, async (inner) => {
          await driver.queryIn(inner, `INSERT INTO ${table} (k) VALUES ($1)`, ['released']);
        });
      });
      expect(await keys()).toEqual(['outer', 'released']);
    });

    it('a nested transaction that committed its savepoint still rolls back with the outer one', async () => {
      await clear();
      await expect(
        driver.transaction(async (tx) => {
          await subject.nested(tx, async (inner) => {
            await driver.queryIn(inner, `INSERT INTO ${table} (k) VALUES ($1)`, ['inner']);
          });
          throw new Error('outer failed');
        }),
      ).rejects.toThrow('outer failed');
      expect(await keys()).toEqual([]);
    });

    it("finds the database's error code through the ORM's wrapping, in and out of a transaction", async () => {
      await clear();
      await driver.query(`INSERT INTO ${table} (k) VALUES ($1)`, ['dup']);
      const outside = await driver
        .query(`INSERT INTO ${table} (k) VALUES ($1)`, ['dup'])
        .catch((e: unknown) => e);
      expect(driver.errorCode(outside)).toBe('23505');
      const inside = await driver
        .transaction((tx) => driver.queryIn(tx, `INSERT INTO ${table} (k) VALUES ($1)`, ['dup']))
        .catch((e: unknown) => e);
      expect(driver.errorCode(inside)).toBe('23505');
      expect(driver.errorCode(new Error('no code'))).toBeUndefined();
    });
  });
}
