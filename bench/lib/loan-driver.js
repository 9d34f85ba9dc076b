import http from 'node:http';
import { LOAN } from './loandesk.js';

/** Sequential POST /loans on one connection: fresh keys, one key replayed, or no key. */
export function loanDriver(url, runId) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const body = Buffer.from(JSON.stringify(LOAN));
  // Unique per driver: a floor's second server reopens the first one's database.
  const prefix = `${runId}-${Math.random().toString(36).slice(2)}`;
  let seq = 0;
  const replayKey = `${prefix}-replay`;
  // Under valgrind a pause (callgrind_control's zero or dump) can outlast the server's keep-alive
  // timeout: a request written to the socket it closed meanwhile is reset unread, and sent again.
  const one = (key) =>
    attempt(key).catch((error) => (error.code === 'ECONNRESET' ? attempt(key) : Promise.reject(error)));
  const attempt = (key) =>
    new Promise((resolve, reject) => {
      const headers = { 'content-type': 'application/json', 'content-length': body.length };
      if (key) headers['idempotency-key'] = key;
      const req = http.request(`${url}/loans`, { method: 'POST', agent, headers }, (res) => {
        res.resume();
        res.on('end', () =>
          res.statusCode < 300 ? resolve() : reject(new Error(`status ${res.statusCode}`)),
        );
      });
      req.on('error', reject);
      req.end(body);
    });
  return {
    async send(kind, count) {
      for (let i = 0; i < count; i++) {
        if (kind === 'fresh') await one(`${prefix}-${seq++}`);
        else if (kind === 'replay') await one(replayKey);
        else await one(undefined);
      }
    },
    close: () => agent.destroy(),
  };
}
