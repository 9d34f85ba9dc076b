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
// The key store's clock, which the demo sets back to send a key "30 days ago".
let clockOffsetMs = 0;
const desk = await startLoanDesk(
  { ...config, database: { ...config.database, now: () => Date.now() + clockOffsetMs } },
  { setup: true },
);
const { store } = desk;

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

/** Every live key, through the store's admin API. */
async function liveKeys() {
  const records = [];
  let after;
  do {
    const page = await store.list({ after });
    records.push(...page.records);
    after = page.next ?? undefined;
  } while (after);
  return records;
}

async function startOver() {
  await store.transaction((db) =>
    db.exec(
      // A loan's receipt job and receipt go with it (ON DELETE CASCADE).
      "DELETE FROM loan; DELETE FROM sqlite_sequence WHERE name = 'loan';",
    ),
  );
  for (const { scope, key } of await liveKeys()) await store.delete(scope, key);
}

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
  // OD-old is sent with the key store's clock 30 days back, as if it had been sent then.
  clockOffsetMs = -30 * DAY_MS;
  await post({ member: 'U-1003', isbn: 'K-07', issuedAt: '2026-02-20' }, 'OD-old');
  clockOffsetMs = 0;
  console.log('OD-old  sent 30 days ago; past the 7-day window, the store no longer lists it');
  for (const { key, createdAtMs } of await liveKeys()) {
    console.log(`${key}  age: ${Math.floor((Date.now() - createdAtMs) / DAY_MS)} days`);
  }
  console.log(`purged: ${await store.purgeExpired()} (OD-old)`);
  console.log(`remaining after cleanup: ${(await liveKeys()).length}`);
  await say('before OD-old is resent');
  const resent = await post({ member: 'U-1003', isbn: 'K-07', issuedAt: '2026-02-20' }, 'OD-old');
  console.log(
    `OD-old again: ${resent.response.status}, replayed: ${resent.response.headers.get('idempotency-replayed') ?? 'no'}`,
  );
  await say('after OD-old is resent');

  if (existsSync(path.join(here, 'faults', 'lossy-demo.js'))) {
    const { runLossyNetworkAct } = await import('./faults/lossy-demo.js');
    console.log('\n--- a lossy network, with and without keys ---');
    await runLossyNetworkAct({ baseUrl: desk.url, intents: 100, seed: 7 });
    await runLossyNetworkAct({ baseUrl: desk.url, intents: 100, seed: 7, keys: false });
  }
} finally {
  await desk.close();
  rmSync(dir, { recursive: true, force: true });
}
