// `npm run demo`: the idempotency-key lesson, measured again on a fresh loan desk.
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startLoanDesk } from './app.js';
import { describe, readConfig } from './config.js';

const DAY_MS = 86_400_000;
const here = path.dirname(fileURLToPath(import.meta.url));
const dir = mkdtempSync(path.join(tmpdir(), 'loan-desk-demo-'));
const config = readConfig({
  DATABASE_URL: path.join(dir, 'library.db'),
  PORT: '0',
  IDEMPOTENCY_TTL: '7d',
});
const desk = await startLoanDesk(config, { setup: true });
// The demo reads and edits the SQLite file directly, as the lesson did with the sqlite3 shell.
const { store } = desk;
const keysTable = 'idempotency_keys';

const BODY = { member: 'U-1001', isbn: 'K-02', issuedAt: '2026-03-10' };

async function post(body, key) {
  const headers = { 'content-type': 'application/json' };
  if (key) headers['idempotency-key'] = key;
  const response = await fetch(`${desk.url}/loans`, { method: 'POST', headers, body: JSON.stringify(body) });
  return { response, text: await response.text() };
}

async function send(body, key) {
  const { response, text } = await post(body, key);
  console.log(`HTTP/1.1 ${response.status} ${response.statusText}`);
  const replayed = response.headers.get('idempotency-replayed');
  if (replayed) console.log(`idempotency-replayed: ${replayed}`);
  console.log(text);
  return text;
}

async function say(label) {
  console.log(`${label.padEnd(30)} loan rows: ${await desk.database.countLoans()}`);
}

const startOver = () =>
  store.transaction((db) =>
    db.exec(`DELETE FROM loan; DELETE FROM sqlite_sequence WHERE name = 'loan'; DELETE FROM ${keysTable};`),
  );

console.log(`loan desk ${desk.url} (${describe(config)})\n`);
try {
  console.log('--- no key, twice ---');
  await send(BODY);
  await send(BODY);
  await say('no key x2');

  await startOver();
  console.log('\n--- same key, twice ---');
  const first = await send(BODY, 'OD-7f21');
  const second = await send(BODY, 'OD-7f21');
  await say('with key x2');
  console.log(`identical bodies: ${first === second ? 'yes' : 'NO'}`);

  console.log('\n--- same key, different body ---');
  const conflict = await post({ member: 'U-1002', isbn: 'K-03', issuedAt: '2026-03-11' }, 'OD-7f21');
  console.log(`status: ${conflict.response.status}  ${conflict.text}`);
  await say('after conflict');

  await startOver();
  console.log('\n--- five concurrent requests, one key ---');
  const concurrentBody = { member: 'U-1002', isbn: 'K-05', issuedAt: '2026-03-12' };
  const bodies = await Promise.all(Array.from({ length: 5 }, () => post(concurrentBody, 'OD-9c04')));
  const variants = [...new Set(bodies.map((b) => b.text))];
  console.log(`statuses                  : ${bodies.map((b) => b.response.status).join(' ')}`);
  console.log(`distinct response bodies  : ${variants.length}`);
  console.log(`body                      : ${variants.join(' | ')}`);
  console.log(`loan rows                 : ${await desk.database.countLoans()}`);

  console.log('\n--- the key store ages (7-day window) ---');
  await post({ member: 'U-1003', isbn: 'K-07', issuedAt: '2026-02-20' }, 'OD-old');
  // As if OD-old had been sent 30 days ago: its record, retention included, moves back in time.
  await store.transaction((db) =>
    db
      .prepare(
        `UPDATE ${keysTable} SET created_at_ms = created_at_ms - @ms, expires_at_ms = expires_at_ms - @ms,
           lease_until_ms = lease_until_ms - @ms, completed_at_ms = completed_at_ms - @ms WHERE key = 'OD-old'`,
      )
      .run({ ms: 30 * DAY_MS }),
  );
  const ages = await store.transaction((db) =>
    db.prepare(`SELECT key, created_at_ms FROM ${keysTable} ORDER BY created_at_ms`).all(),
  );
  for (const { key, created_at_ms } of ages) {
    console.log(`${key}  age: ${Math.floor((Date.now() - created_at_ms) / DAY_MS)} days`);
  }
  console.log(`purged: ${await store.purgeExpired()}`);
  const remaining = await store.transaction((db) =>
    db.prepare(`SELECT count(*) FROM ${keysTable}`).pluck().get(),
  );
  console.log(`remaining after cleanup: ${remaining}`);
  await say('before OD-old is resent');
  const resent = await post({ member: 'U-1003', isbn: 'K-07', issuedAt: '2026-02-20' }, 'OD-old');
  console.log(
    `OD-old again: ${resent.response.status}, replayed: ${resent.response.headers.get('idempotency-replayed') ?? 'no'}`,
  );
  await say('after OD-old is resent');

  if (existsSync(path.join(here, 'lossy-demo.js'))) {
    const { runLossyNetworkAct } = await import('./lossy-demo.js');
    console.log('\n--- a lossy network, with and without keys ---');
    await runLossyNetworkAct({ baseUrl: desk.url, intents: 100, seed: 7 });
    await runLossyNetworkAct({ baseUrl: desk.url, intents: 100, seed: 7, keys: false });
  }
} finally {
  await desk.close();
  rmSync(dir, { recursive: true, force: true });
}
