// `npm run torture`: retrying clients × app processes on every store, while a schedule injects
// faults; every attempt and every effect recorded, then judged by checker.js.
//
//   node scripts/torture/run.js [--duration 20] [--stores sqlite,postgres,…] [--modes lease,atomic]
//                               [--apps 3] [--clients 8] [--out bench/results/torture.md]
//   node scripts/torture/run.js --check FILE    judge a kept history again
//
// Exits 1 when any history has an anomaly (each such history is kept as JSON beside --out) or an
// app process crashed (exited by itself: an unhandled error).
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import { createRetryingFetch, isRetryBudgetExceededError } from 'retrysafe/client';
import { freePort } from '../../bench/lib/proc.js';
import { createFaultProxy } from '../../examples/library-loans/faults/fault-proxy.js';
import { check, RULES } from './checker.js';
import { stopServers } from './servers.js';
import { TARGETS } from './targets.js';

const APP = path.join(import.meta.dirname, 'app.js');

/**
 * The lease every app runs with: shorter than the handlers that hold (HOLD_MS), so those finish
 * only if renewals (every third of the lease) keep reaching the store under the faults.
 */
const LEASE = '1s';
const HOLD_MS = 1500;
/** One order in HOLD_EVERY holds past its lease. */
const HOLD_EVERY = 8;
/** Clocks of the app processes, by index (Debian's faketime): the database's clock stays true. */
const SKEWS = [null, '+5m', '-3m'];
/** Between two scheduled faults. */
const FAULT_EVERY_MS = 600;
/** How long a lock, a delay or a stall lasts: past the 1 s lease, within the client's budget. */
const FAULT_SPAN_MS = 1500;
/** A client's budget for one intent: room for a restart, a lease and a lock. */
const CALL_DEADLINE_MS = 20_000;
/** Starts of an app process before the run gives up on it: faults outlast a few. */
const START_ATTEMPTS = 20;
/** Rates of the HTTP fault proxy in front of each app (client ↔ app loss). */
const HTTP_FAULTS = { refuseRate: 0.03, dropRate: 0.05, delayRate: 0.05, delayMs: 300 };
/**
 * Faults that must land, one at a time (a turn that finds the last one still going is skipped): the
 * run fails when one does not. A lock or a kill that meets a server being restarted (or a
 * connection ended) may fail: that is the schedule crossing itself.
 */
const MUST_LAND = new Set(['db-restart', 'master-kill']);

/**
 * An app process, restartable on its port; SIGKILLed by the schedule. `crashes` lists the exits
 * it made by itself after it served (an unhandled error), with what it printed last.
 */
function appProcess(index, port, env) {
  let child;
  let exited = Promise.resolve();
  const crashes = [];
  const startOnce = async () => {
    const skew = SKEWS[index % SKEWS.length];
    const [command, args] = skew
      ? ['faketime', ['-f', skew, process.execPath, APP]]
      : [process.execPath, [APP]];
    child = spawn(command, args, {
      env: { ...process.env, ...env, PORT: String(port), LEASE },
      stdio: ['ignore', 'pipe', 'pipe'],
      // Its own process group: faketime runs node as its child, and a kill must reach both.
      detached: true,
    });
    let output = '';
    let serving = false;
    exited = new Promise((resolve) => child.once('exit', resolve));
    child.once('exit', (code, signal) => {
      if (serving && signal !== 'SIGKILL') crashes.push(`exit ${code ?? signal}: ${output.slice(-600)}`);
    });
    await new Promise((resolve, reject) => {
      child.stdout.on('data', (text) => {
        output += text;
        if (output.includes('listening')) {
          serving = true;
          resolve();
        }
      });
      child.stderr.on('data', (text) => (output += text));
      child.once('exit', (code) =>
        reject(new Error(`app ${index} exited (${code}) before listening:\n${output}`)),
      );
    });
  };
  // As a supervisor would: an app that cannot start (its database locked or unreachable by a
  // fault) is started again.
  const start = async () => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await startOnce();
      } catch (error) {
        if (attempt === START_ATTEMPTS) throw error;
        await sleep(300);
      }
    }
  };
  return {
    name: `app${index}${SKEWS[index % SKEWS.length] ?? ''}`,
    /** Where clients reach it: the HTTP fault proxy in front of it. */
    proxyPort: 0,
    crashes,
    start,
    async kill() {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
      await exited;
    },
  };
}

/**
 * One (store, mode): apps, clients and faults for `durationMs`, then the final replay pass.
 * `faultSpanMs` (how long a lock, a delay or a stall lasts) and `callDeadlineMs` (a client's
 * budget per intent) are shortened by the CI schedule, whose run ends when its last call does.
 */
export async function tortureOne(
  storeName,
  mode,
  {
    durationMs,
    apps: appCount,
    clients: clientCount,
    faultSpanMs = FAULT_SPAN_MS,
    callDeadlineMs = CALL_DEADLINE_MS,
  },
) {
  const target = await TARGETS[storeName].open();
  const faults = { 'app-sigkill': 0, 'clock-skewed apps': 0, 'handler past lease': 0 };
  const attempts = [];
  const apps = [];
  const proxies = [];
  try {
    // Started side by side: each waits on its own database connections and Node's start-up.
    await Promise.all(
      Array.from({ length: appCount }, async (_, index) => {
        const port = await freePort();
        const app = appProcess(index, port, { ...target.env, MODE: mode });
        apps[index] = app;
        await app.start();
        if (SKEWS[index % SKEWS.length]) faults['clock-skewed apps']++;
        const proxy = createFaultProxy({ targetPort: port, ...HTTP_FAULTS });
        proxies.push(proxy);
        app.proxyPort = await proxy.start();
      }),
    );

    /** A retrying client whose `fetch` goes to a random app and records each attempt. */
    const client = (name, phase, pick = () => apps[Math.floor(Math.random() * apps.length)]) => {
      return createRetryingFetch({
        deadlineMs: callDeadlineMs,
        attemptTimeoutMs: 8000,
        baseDelayMs: 50,
        maxDelayMs: 1000,
        async fetch(input, init) {
          const app = pick();
          const request = new Request(input, init);
          const body = await request.text();
          const record = {
            client: name,
            scope: request.headers.get('authorization'),
            key: request.headers.get('idempotency-key'),
            body,
            startMs: Date.now(),
            app: app.name,
            phase,
          };
          try {
            const response = await fetch(`http://127.0.0.1:${app.proxyPort}/orders`, {
              method: request.method,
              headers: request.headers,
              body,
              signal: request.signal,
            });
            const answer = await response.text();
            // The fault proxy's own 502 when the app is down is no answer of the app's.
            const gateway = response.status === 502 && answer === '{"error":"bad_gateway"}';
            attempts.push({
              ...record,
              endMs: Date.now(),
              status: gateway ? 0 : response.status,
              answer: gateway ? 'app unreachable' : answer,
              retryAfter: response.headers.get('retry-after'),
              replayed: response.headers.get('idempotency-replayed') === 'true',
            });
            return new Response(answer, { status: response.status, headers: response.headers });
          } catch (error) {
            attempts.push({
              ...record,
              endMs: Date.now(),
              status: 0,
              answer: String(error?.cause?.code ?? error?.name ?? error),
              retryAfter: null,
              replayed: false,
            });
            throw error;
          }
        },
      });
    };
    const send = (retryingFetch, key, body) =>
      retryingFetch('http://torture/orders', {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${key.scope}` },
        body,
        idempotencyKey: key.key,
      }).then(
        (response) => response.status,
        (error) => {
          if (isRetryBudgetExceededError(error)) return 0;
          throw error;
        },
      );

    const endAtMs = Date.now() + durationMs;
    const acknowledged = [];
    let orders = 0;
    const keysSeen = [];
    const runClient = async (index) => {
      const name = `client${index}`;
      const retryingFetch = client(name, 'load');
      while (Date.now() < endAtMs) {
        // Now and then a key string another client (another scope) used: another operation.
        const others = keysSeen.filter((seen) => seen.client !== name);
        const borrowed = others.length > 0 && Math.random() < 0.1;
        const key = {
          scope: name,
          key: borrowed ? others[Math.floor(Math.random() * others.length)].key : randomUUID(),
        };
        keysSeen.push({ client: name, key: key.key });
        const holdMs = orders++ % HOLD_EVERY === 0 ? HOLD_MS : 0;
        if (holdMs > 0) faults['handler past lease']++;
        const body = JSON.stringify({ item: `${name}:${key.key}`, holdMs });
        // Sometimes the same intent twice at once (a double click), both with the key.
        const duplicates = Math.random() < 0.15 ? 2 : 1;
        const statuses = await Promise.all(
          Array.from({ length: duplicates }, () => send(retryingFetch, key, body)),
        );
        if (!statuses.some((status) => status >= 200 && status < 300)) continue;
        acknowledged.push({ ...key, body });
        // The key reused with another body: must never execute.
        if (Math.random() < 0.2) {
          await send(retryingFetch, key, JSON.stringify({ item: `${name}:${key.key}:other`, holdMs: 0 }));
        }
      }
    };

    const schedule = async () => {
      const kinds = ['app-sigkill', ...Object.keys(target.faults)];
      if (target.proxy) kinds.push('link-reset', 'link-delay', 'link-stall');
      for (const kind of kinds) faults[kind] ??= 0;
      const pending = [];
      const restarting = new Set();
      const landing = new Set();
      // A short run still gives each kind its turn.
      const everyMs = Math.min(FAULT_EVERY_MS, durationMs / (kinds.length + 1));
      for (let turn = 0; turn < kinds.length || Date.now() < endAtMs - everyMs; turn++) {
        await sleep(everyMs);
        const kind = kinds[turn % kinds.length];
        if (landing.has(kind)) continue;
        faults[kind]++;
        if (kind === 'app-sigkill') {
          // One restart at a time per app: a second kill would race the first one's start for its port.
          const idle = apps.filter((app) => !restarting.has(app));
          const app = idle[Math.floor(Math.random() * idle.length)];
          if (!app) continue;
          restarting.add(app);
          pending.push(
            app
              .kill()
              .then(() => sleep(200))
              .then(app.start)
              .finally(() => restarting.delete(app)),
          );
        } else if (kind === 'link-reset') target.proxy.reset();
        else if (kind === 'link-delay') {
          target.proxy.delay(200);
          pending.push(sleep(faultSpanMs).then(() => target.proxy.delay(0)));
        } else if (kind === 'link-stall') target.proxy.stall(faultSpanMs);
        else {
          const landed = Promise.resolve(target.faults[kind](faultSpanMs));
          if (MUST_LAND.has(kind)) {
            landing.add(kind);
            // Its failure is handled here and thrown by the Promise.all below.
            landed.then(
              () => landing.delete(kind),
              () => {},
            );
            pending.push(landed);
          } else pending.push(landed.catch(() => {}));
        }
      }
      await Promise.all(pending);
    };

    await Promise.all([schedule(), ...Array.from({ length: clientCount }, (_, index) => runClient(index))]);

    // Every app restarted, no fault any more: each acknowledged key must still replay.
    await Promise.all(apps.map((app) => app.kill().then(app.start)));
    let next = 0;
    const replayer = client('replay', 'replay', () => apps[next++ % apps.length]);
    const queue = [...acknowledged];
    const replayOne = async () => {
      for (let key = queue.pop(); key; key = queue.pop()) await send(replayer, key, key.body);
    };
    await Promise.all(Array.from({ length: clientCount }, replayOne));

    const httpStats = proxies.reduce(
      (sum, proxy) => ({
        refused: sum.refused + proxy.stats.refused,
        dropped: sum.dropped + proxy.stats.dropped,
        delayed: sum.delayed + proxy.stats.delayed,
      }),
      { refused: 0, dropped: 0, delayed: 0 },
    );
    faults['http refused'] = httpStats.refused;
    faults['http answer lost'] = httpStats.dropped;
    faults['http answer late'] = httpStats.delayed;
    const crashes = apps.flatMap((app) => app.crashes.map((crash) => `${app.name} ${crash}`));
    return { store: storeName, mode, attempts, effects: await target.effects(), faults, crashes };
  } finally {
    for (const app of apps) await app?.kill();
    for (const proxy of proxies) await proxy.close();
    await target.close();
  }
}

/** Judges each history; keeps those with anomalies as JSON in `keepDir` (when given); returns the table rows. */
export function judge(histories, keepDir) {
  return histories.map((history) => {
    const verdict = check(history);
    let kept;
    if (verdict.anomalies.length > 0 && keepDir !== undefined) {
      mkdirSync(keepDir, { recursive: true });
      kept = path.join(keepDir, `torture-${history.store}-${history.mode}-${Date.now()}.json`);
      writeFileSync(kept, JSON.stringify(history));
    }
    return { history, verdict, kept };
  });
}

/** The published table: one row per store and mode. */
export function table(rows) {
  const kinds = [...new Set(rows.flatMap(({ history }) => Object.keys(history.faults)))];
  const header = [
    'store',
    'mode',
    'attempts',
    'keys',
    'acknowledged',
    're-executions',
    'answered again',
    ...kinds,
    'app crashes',
    'anomalies',
  ];
  const lines = [`| ${header.join(' | ')} |`, `|${header.map(() => '---').join('|')}|`];
  for (const { history, verdict } of rows) {
    const cells = [
      history.store,
      history.mode,
      history.attempts.length,
      verdict.keys,
      verdict.acknowledged,
      verdict.reExecutions,
      verdict.answeredAgain,
      ...kinds.map((kind) => history.faults[kind] ?? '—'),
      history.crashes?.length ?? '—',
      verdict.anomalies.length,
    ];
    lines.push(`| ${cells.join(' | ')} |`);
  }
  return lines.join('\n');
}

function printAnomalies(rows) {
  for (const { history, verdict, kept } of rows) {
    for (const anomaly of verdict.anomalies.slice(0, 20)) {
      console.error(
        `${history.store}/${history.mode} ${anomaly.rule} (${RULES[anomaly.rule]}) ${anomaly.scope} ${anomaly.key}: ${anomaly.detail}`,
      );
    }
    if (kept) console.error(`history kept: ${kept} (node scripts/torture/run.js --check ${kept})`);
    for (const crash of history.crashes ?? [])
      console.error(`${history.store}/${history.mode} crashed: ${crash}`);
  }
}

async function main() {
  const { values } = parseArgs({
    options: {
      duration: { type: 'string', default: '20' },
      stores: { type: 'string', default: Object.keys(TARGETS).join(',') },
      modes: { type: 'string', default: 'lease,atomic' },
      apps: { type: 'string', default: '3' },
      clients: { type: 'string', default: '8' },
      out: { type: 'string', default: 'bench/results/torture.md' },
      check: { type: 'string' },
    },
  });
  if (values.check) {
    const rows = judge([JSON.parse(readFileSync(values.check, 'utf8'))]);
    console.log(table(rows));
    printAnomalies(rows);
    process.exitCode = rows[0].verdict.anomalies.length > 0 ? 1 : 0;
    return;
  }
  const options = {
    durationMs: Number(values.duration) * 1000,
    apps: Number(values.apps),
    clients: Number(values.clients),
  };
  const histories = [];
  try {
    for (const store of values.stores.split(',')) {
      if (!TARGETS[store])
        throw new Error(`unknown store ${store}: one of ${Object.keys(TARGETS).join(', ')}`);
      for (const mode of TARGETS[store].modes.filter((m) => values.modes.split(',').includes(m))) {
        console.log(`torture: ${store} ${mode} for ${values.duration} s`);
        histories.push(await tortureOne(store, mode, options));
      }
    }
  } finally {
    await stopServers();
  }
  const rows = judge(histories, path.join(path.dirname(values.out), 'torture-histories'));
  const text = `# Torture run\n\n${new Date().toISOString()}: ${values.duration} s per store and mode, ${values.apps} app processes, ${values.clients} retrying clients (\`npm run torture\`, scripts/torture/run.js).\n\n${table(rows)}\n\nRules: ${Object.values(RULES).join('; ')}.\n`;
  mkdirSync(path.dirname(values.out), { recursive: true });
  writeFileSync(values.out, text);
  console.log(text);
  printAnomalies(rows);
  const failed = rows.some(({ history, verdict }) => verdict.anomalies.length + history.crashes.length > 0);
  process.exitCode = failed ? 1 : 0;
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
