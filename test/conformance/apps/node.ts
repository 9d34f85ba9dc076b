import http, { type IncomingMessage } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { idempotency } from '../../../src/adapters/node.js';
import { type AdapterUnderTest, listen, paced, plan } from '../../../src/testing/adapter-suite.js';

// The adapter suite's catalog served by node:http: its conformance tests and the adapter fuzz
// (test/fuzz) run against this app.

export const nodeAdapter: AdapterUnderTest = {
  name: 'node',
  throwPaths: ['/throw'],
  async start({ scopeByAuthorization, ...options }) {
    const calls: Record<string, number> = {};
    const guard = idempotency({
      ...options,
      ...(scopeByAuthorization ? { scope: (req: IncomingMessage) => req.headers.authorization ?? '' } : {}),
    });
    const listener = guard(async (req, res, idem) => {
      const planned = plan(calls, req.method!, new URL(req.url!, 'http://x'), idem, req.body);
      if (planned.delayMs) await sleep(planned.delayMs);
      if (planned.kind === 'fail') throw new Error('boom');
      const json = planned.kind === 'json' ? { 'content-type': 'application/json' } : {};
      res.writeHead(planned.status, { ...planned.headers, ...json });
      switch (planned.kind) {
        case 'json':
          return void res.end(JSON.stringify(planned.json));
        case 'text':
          return void res.end(planned.text);
        case 'bytes':
          return void res.end(planned.bytes);
        case 'empty':
          return void res.end();
        case 'stream':
          for await (const chunk of paced(planned.chunks)) res.write(chunk);
          res.end();
      }
    });
    return listen(http.createServer(listener), calls, guard.resumeThrough(listener));
  },
};
