// node bench/sqlite-driver-ops.js [--root ../other-checkout] [--blocks N] [--per N]   (Node ≥ 22.16)
// The SQLite store's atomic call (a fresh key, one INSERT of the handler, the saved answer, the
// commit) on better-sqlite3 and on node:sqlite, in one process, in alternating blocks: median µs of
// wall and CPU time per call, and node:sqlite ÷ better-sqlite3 in calls per second. With --root,
// another checkout's build (after `npm run build` there) is measured beside this one's.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { median } from './lib/median.js';

const { values } = parseArgs({
  options: {
    root: { type: 'string' },
    blocks: { type: 'string', default: '12' },
    per: { type: 'string', default: '400' },
  },
});
const here = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const builds = [['this build', here], ...(values.root ? [['--root', path.resolve(values.root)]] : [])];
const dir = mkdtempSync(path.join(os.tmpdir(), 'driver-ops-'));
const response = { status: 201, headers: {}, body: new TextEncoder().encode('{"id":1}') };

const calls = new Map();
for (const [build, root] of builds) {
  const { sqliteStore } = await import(path.join(root, 'dist/stores/sqlite/index.js'));
  for (const driver of ['better-sqlite3', 'node:sqlite']) {
    const url = path.join(dir, `${calls.size}.db`);
    const store = sqliteStore({ url, driver, migrate: true });
    store.database.exec('CREATE TABLE loan (id INTEGER PRIMARY KEY AUTOINCREMENT, member TEXT NOT NULL)');
    const insert = store.database.prepare('INSERT INTO loan (member) VALUES (?) RETURNING id');
    let n = 0;
    calls.set(`${build}, ${driver}`, async () => {
      const input = { scope: 's', key: `k${n++}`, fingerprint: 'fp', leaseMs: 60_000, retainMs: 86_400_000 };
      const result = await store.atomic(input, async () => {
        insert.get('U-1001');
        return { response, commit: true };
      });
      if (result.outcome !== 'executed') throw new Error(`a fresh key answered ${result.outcome}`);
    });
  }
}
const names = [...calls.keys()];
for (const call of calls.values()) for (let i = 0; i < 1000; i++) await call();
const wall = new Map(names.map((name) => [name, []]));
const cpu = new Map(names.map((name) => [name, []]));
const per = Number(values.per);
for (let block = 0; block < Number(values.blocks); block++) {
  for (let i = 0; i < names.length; i++) {
    const name = names[(i + block) % names.length];
    const call = calls.get(name);
    const cpu0 = process.cpuUsage();
    const wall0 = performance.now();
    for (let k = 0; k < per; k++) await call();
    const used = process.cpuUsage(cpu0);
    wall.get(name).push(((performance.now() - wall0) * 1000) / per);
    cpu.get(name).push((used.user + used.system) / per);
  }
}
console.log(`Node ${process.version}, ${values.blocks} blocks of ${per} calls each, medians`);
for (const name of names) {
  console.log(
    `${name}: ${median(wall.get(name)).toFixed(1)} µs wall, ${median(cpu.get(name)).toFixed(1)} µs CPU a call`,
  );
}
for (const [build] of builds) {
  const ratio = (times) =>
    (median(times.get(`${build}, better-sqlite3`)) / median(times.get(`${build}, node:sqlite`))).toFixed(3);
  console.log(`${build}: node:sqlite ÷ better-sqlite3 ${ratio(wall)} (wall), ${ratio(cpu)} (CPU)`);
}
rmSync(dir, { recursive: true, force: true });
