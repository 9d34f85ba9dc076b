import { existsSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// The bench's load generator (autocannon) is a dependency of bench/ only, installed by the first
// `npm run bench`; bench/lib/load.js is imported only where it is.
const installed = existsSync(join(import.meta.dirname, '..', 'bench', 'node_modules', 'autocannon'));

describe.skipIf(!installed)('bench load generator', () => {
  let server: http.Server;
  let url: string;
  let answered = 0;

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        answered++;
        res.writeHead(201).end('{}');
      });
    });
    server.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => {
    server.closeAllConnections();
    server.close();
  });

  it('loadDuring returns once its load has stopped, so it never overlaps the next run', async () => {
    const { CONNECTIONS, loadDuring } = await import('../bench/lib/load.js');
    const result = await loadDuring({ url, body: { item: 'book' } }, () => sleep(100));
    const atReturn = answered;
    await sleep(300);
    expect(result.rps).toBeGreaterThan(0);
    // At most the requests that were on the wire when it stopped, one per connection.
    expect(answered - atReturn).toBeLessThanOrEqual(CONNECTIONS);
  });
});

// The in-process exchange of the engine and tricks scenarios stands for a request off the wire:
// whatever the adapter reads of its headers must be there, as node's HTTP parser leaves them.
describe('bench in-process exchange', () => {
  it('gives the request its headers as node parses them: headers, rawHeaders and headersDistinct', async () => {
    const { exchange } = await import('../bench/lib/exchange.js');
    let seen: Record<string, unknown> = {};
    const status = await exchange(
      (req, res) => {
        seen = { headers: req.headers, raw: req.rawHeaders, distinct: { ...req.headersDistinct } };
        res.writeHead(201).end();
      },
      'key-1',
      Buffer.from('{}'),
    );
    expect(status).toBe(201);
    expect(seen).toEqual({
      headers: { 'content-type': 'application/json', 'idempotency-key': 'key-1' },
      raw: ['Content-Type', 'application/json', 'Idempotency-Key', 'key-1'],
      distinct: { 'content-type': ['application/json'], 'idempotency-key': ['key-1'] },
    });
  });
});
