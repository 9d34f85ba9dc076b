import http from 'node:http';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/node.js';
import { memoryStore } from '../src/stores/memory.js';
import { describeAdapterConformance, listen, type RunningApp } from '../src/testing/adapter-suite.js';
import { nodeAdapter } from './conformance/apps/node.js';
import {
  drizzle,
  drizzleMysql,
  knex,
  knexMysql,
  kysely,
  kyselyMysql,
  prisma,
  typeorm,
  typeormMysql,
} from './support/orm-store-factories.js';
import {
  memory,
  mysql,
  postgres,
  postgresBehindPgBouncer,
  redis,
  sqlite,
} from './support/store-factories.js';

describeAdapterConformance(nodeAdapter, [memory, sqlite, postgres, postgresBehindPgBouncer, mysql, redis]);
// The ORM stores through one adapter: the engine's atomic path over each ORM's transaction.
describeAdapterConformance(nodeAdapter, [drizzle, kysely, knex, typeorm, prisma]);
// And on MariaDB, the MySQL dialect.
describeAdapterConformance(nodeAdapter, [drizzleMysql, kyselyMysql, knexMysql, typeormMysql]);

const MiB = 1024 * 1024;

/**
 * A POST declaring a 100 MB body, of which it writes `bytes` and then nothing, without closing.
 * Resolves with what the server sent once the server closed the connection.
 */
function stallingUpload(url: string, bytes: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(new URL(url).port), '127.0.0.1');
    let received = '';
    socket.setTimeout(15_000, () => {
      reject(new Error('the server never closed the connection'));
      socket.destroy();
    });
    socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')));
    // Writing into a connection the server closed fails (EPIPE, ECONNRESET): that is the point.
    socket.on('error', () => undefined);
    socket.on('close', () => resolve(received));
    socket.write('POST /x HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 100000000\r\n\r\n');
    if (bytes > 0) socket.write(Buffer.alloc(bytes, 0x61));
  });
}

describe('node specifics', () => {
  const store = memoryStore();
  let app: RunningApp;
  let calls = 0;
  let flushedEarly = false;
  beforeAll(async () => {
    const guard = idempotency({ store });
    app = await listen(
      http.createServer(
        guard(async (req, res) => {
          calls++;
          res.setHeader('set-cookie', 'sid=1');
          res.setHeader('location', '/x/1');
          if (req.url === '/throw-after-headers') throw new Error('boom');
          res.statusCode = 201;
          res.flushHeaders();
          flushedEarly ||= res.headersSent;
          res.write('early ');
          await sleep(5);
          res.end(`late ${calls}`);
        }),
      ),
      {},
    );
  });
  afterAll(async () => {
    await app.close();
    await store.close();
  });

  const post = (path: string, key: string) =>
    fetch(app.url + path, { method: 'POST', headers: { 'idempotency-key': key }, body: 'x' });

  it('a refused upload is read off within bounds, then the connection closed: past 8 MiB, or after 5 s of silence', async () => {
    const sockets: net.Socket[] = [];
    const server = http.createServer(idempotency({ store })(() => undefined));
    server.on('connection', (socket) => sockets.push(socket));
    const bounded = await listen(server, {});
    try {
      const flooded = await stallingUpload(bounded.url, 20 * MiB);
      expect(flooded).toMatch(/^HTTP\/1\.1 413 /);
      expect(flooded.toLowerCase()).toContain('\r\nconnection: close\r\n');
      expect(sockets[0]!.bytesRead).toBeGreaterThan(8 * MiB);
      expect(sockets[0]!.bytesRead).toBeLessThan(12 * MiB);
      expect(await stallingUpload(bounded.url, 0)).toMatch(/^HTTP\/1\.1 413 /);
    } finally {
      await bounded.close();
    }
  });

  it('flushHeaders() does not send the status before the response is saved', async () => {
    const first = await post('/flush', 'flush-1');
    expect([first.status, await first.text()]).toEqual([201, 'early late 1']);
    expect(flushedEarly).toBe(false);
    const replay = await post('/flush', 'flush-1');
    expect(replay.headers.get('idempotency-replayed')).toBe('true');
    expect(await replay.text()).toBe('early late 1');
  });

  it('a handler that throws after setting headers answers 500 without them, and frees the key', async () => {
    const failed = await post('/throw-after-headers', 'headers-1');
    expect(failed.status).toBe(500);
    expect(await failed.json()).toMatchObject({ error: 'internal_error' });
    expect(failed.headers.get('set-cookie')).toBeNull();
    expect(failed.headers.get('location')).toBeNull();
    const before = calls;
    expect((await post('/throw-after-headers', 'headers-1')).status).toBe(500);
    expect(calls).toBe(before + 1);
  });
});
