// The business logic every peers contender protects, the same in every bench app.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';

/** How long `work` takes: none for the throughput runs, longer for the race probes. */
let delayMs = 0;
let executions = 0;
const crashed = new Set();

export async function work(body) {
  executions++;
  if (delayMs > 0) await sleep(delayMs);
  if (body?.crashOnce && !crashed.has(body.crashOnce)) {
    crashed.add(body.crashOnce);
    throw new Error('handler crashed');
  }
  return { id: randomUUID(), item: body?.item, qty: body?.qty };
}

/** The server's `stats` command: executions of `work`, and memory after a GC when exposed. */
export function stats() {
  globalThis.gc?.();
  const { rss, heapUsed } = process.memoryUsage();
  return { executions, rssBytes: rss, heapUsedBytes: heapUsed };
}

/** The server's `delay` command: from now on `work` takes `ms` (the peers' probes set it). */
export function delay({ ms }) {
  delayMs = ms;
}
