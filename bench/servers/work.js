// The business logic every peers contender protects, the same in every bench app.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';

const HANDLER_DELAY_MS = Number(process.env.HANDLER_DELAY_MS ?? 0);

let executions = 0;
const crashed = new Set();

export async function work(body) {
  executions++;
  if (HANDLER_DELAY_MS > 0) await sleep(HANDLER_DELAY_MS);
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
