import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { judge, tortureOne } from '../../scripts/torture/run.js';
import { stopServers } from '../../scripts/torture/servers.js';
import { TARGETS } from '../../scripts/torture/targets.js';
import { hasPgBouncer } from '../support/pgbouncer.js';
import { hasRedisCluster } from '../support/redis-cluster.js';
import { hasMysql, hasPostgres, hasRedis } from '../support/services.js';

/**
 * The torture run's short schedule (`npm run torture` runs the long one): on every store and
 * mode, retrying clients × 3 app processes (two with skewed clocks) for a few seconds while every
 * fault kind the store can take lands at least once; the checker must find nothing. A failing
 * history is kept as JSON (its path in the failure) for `node scripts/torture/run.js --check`.
 */
const SHORT = { durationMs: 2500, apps: 3, clients: 6, faultSpanMs: 1200, callDeadlineMs: 8000 };

const available: Record<string, boolean> = {
  sqlite: true,
  postgres: hasPostgres,
  pgbouncer: hasPostgres && hasPgBouncer,
  drizzle: hasPostgres,
  mysql: hasMysql,
  redis: hasRedis && hasPostgres,
  'redis-cluster': hasRedisCluster && hasPostgres,
};

// About 90 s: CI runs it on its first Node only, as it does the other heavy suites.
const repeat = process.env.RETRYSAFE_CI_REPEAT === '1';
if (repeat) console.warn('\ntorture: skipped on this Node, run on CI’s first one\n');

describe.skipIf(repeat)('torture, short schedule', () => {
  // The run's own PostgreSQL, Redis, MariaDB and Redis Cluster, started by the first run that needs each.
  afterAll(stopServers);
  for (const [store, { modes }] of Object.entries(TARGETS)) {
    for (const mode of modes) {
      it.skipIf(!available[store])(`${store}, ${mode} mode: zero anomalies under every fault`, async () => {
        const history = await tortureOne(store, mode, SHORT);
        const [{ verdict, kept }] = judge([history], path.join(tmpdir(), 'retrysafe-torture'));
        expect(verdict.anomalies, `history kept: ${kept}`).toEqual([]);
        // An app process that exits by itself (an unhandled error) is a defect, whatever the checker says.
        expect(history.crashes).toEqual([]);
        expect(verdict.acknowledged).toBeGreaterThan(0);
        // Every scheduled kind had its turn (the HTTP proxy's faults are random rolls, counted only).
        for (const [kind, count] of Object.entries(history.faults)) {
          if (!kind.startsWith('http ')) expect(count, kind).toBeGreaterThan(0);
        }
      });
    }
  }
});
