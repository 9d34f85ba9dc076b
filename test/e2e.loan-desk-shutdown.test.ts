import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { startLoanDesk } from './support/loan-desk.js';

/**
 * SIGTERM, as a deploy or `docker stop` sends it: the desk stops accepting connections, lets the
 * requests in flight finish, says so, and exits 0; with WORKERS=N the primary passes it on and
 * every worker does the same.
 */

/** A POST /loans whose headers are sent and whose body is held back until `finish()`. */
async function heldPost(port: number) {
  const body = JSON.stringify({ member: 'U-1001', isbn: 'K-01', issuedAt: '2026-04-01' });
  const socket = net.connect(port, '127.0.0.1');
  let received = '';
  socket.setEncoding('latin1').on('data', (chunk: string) => (received += chunk));
  const ended = new Promise<void>((resolve, reject) => {
    socket.once('close', () => resolve());
    socket.once('error', reject);
  });
  socket.write(
    [
      'POST /loans HTTP/1.1',
      'Host: 127.0.0.1',
      'Content-Type: application/json',
      `Idempotency-Key: held-${randomUUID()}`,
      `Content-Length: ${body.length}`,
      // The server's 100 Continue says the request reached the desk's handler.
      'Expect: 100-continue',
      '',
      '',
    ].join('\r\n'),
  );
  while (!received.includes('100 Continue')) {
    await new Promise((resolve) => socket.once('data', resolve));
  }
  return {
    async finish() {
      socket.end(body);
      await ended;
      const answer = received.slice(received.indexOf('\r\n\r\n') + 4);
      return { status: Number(/HTTP\/1\.1 (?!100)(\d{3})/.exec(answer)?.[1]), text: answer };
    },
  };
}

/** Whether a new connection to the port is refused, tried until it is (or 40 tries). */
async function refusesConnections(port: number): Promise<boolean> {
  for (let attempt = 0; attempt < 40; attempt++) {
    const refused = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, '127.0.0.1');
      socket.once('connect', () => {
        socket.destroy();
        resolve(false);
      });
      socket.once('error', (error: NodeJS.ErrnoException) => resolve(error.code === 'ECONNREFUSED'));
    });
    if (refused) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return false;
}

async function untilOutput(desk: { output(): string }, pattern: RegExp, count: number) {
  while ((desk.output().match(new RegExp(pattern, 'g')) ?? []).length < count) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe.each([1, 2])('loan desk with WORKERS=%i on SIGTERM', (workers) => {
  it('a request in flight gets its answer, new connections are refused, it says so and exits 0', async () => {
    const desk = await startLoanDesk({ workers });
    // The primary announces the port once every worker listens, but a worker takes SIGTERM as its
    // own only once it says it serves: passed on before that (a loaded machine), it died unheard
    // and this test waited for its "stopped accepting" for good (once in CI, Node 22).
    await untilOutput(desk, /worker \d+ serving/, workers > 1 ? workers : 0);
    const held = await heldPost(desk.port);
    process.kill(desk.pid, 'SIGTERM');
    await untilOutput(desk, /stopped accepting connections/, workers);
    expect(await refusesConnections(desk.port)).toBe(true);
    const answer = await held.finish();
    expect(answer.status).toBe(201);
    expect(await desk.exited()).toBe(0);
    expect(desk.output()).toMatch(/finishing the requests in flight \(at most 5 s\)/);
    expect(desk.output().match(/loan desk( worker \d+)?: stopped$/gm)).toHaveLength(workers);
  }, 30_000);
});
