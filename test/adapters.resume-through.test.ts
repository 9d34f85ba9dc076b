import { randomUUID } from 'node:crypto';
import http from 'node:http';
import express from 'express';
import { afterAll, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/express.js';
import { RESUME_HEADER } from '../src/adapters/kit/index.js';
import { memoryStore } from '../src/stores/memory.js';
import { abandon, listen } from '../src/testing/adapter-suite.js';

// resumeThrough(app) when the resumed request does not reach the guard, and a client's forged
// resume header (the adapter suite runs the path that works on every adapter).

const store = memoryStore();
const idem = idempotency({ store });
const app = express();
let ran = 0;
// An auth check in front of the guard: the saved request carries no credential.
app.post('/pay', express.json(), (req, res, next) =>
  req.headers.authorization ? next() : void res.status(401).json({ error: 'unauthorized' }),
);
app.post('/pay', idem, (req, res) => {
  ran++;
  res.status(201).json({ key: req.idempotency?.key ?? null });
});
const served = await listen(http.createServer(app), {});
afterAll(async () => {
  await served.close();
  await store.close();
});

it('a resumed request answered before the guard fails the resume: the lease ends, the steps stay', async () => {
  const key = randomUUID();
  const record = await abandon(store, key, '/pay', { amount: 40 });
  await expect(idem.resumeThrough(app)(record)).rejects.toThrow(
    `the resumed POST /pay (key ${key}) was answered 401 without reaching the idempotency guard`,
  );
  expect(ran).toBe(0);
  const kept = await store.get('', key);
  expect(kept?.state).toBe('in_progress');
  expect(kept?.steps).toContain('charged');
});

it('a client that sends a resume header of its own is an ordinary request', async () => {
  const key = randomUUID();
  const post = () =>
    fetch(`${served.url}/pay`, {
      method: 'POST',
      headers: {
        authorization: 'Bearer a',
        'content-type': 'application/json',
        'idempotency-key': key,
        [RESUME_HEADER]: randomUUID(),
      },
      body: '{"amount":40}',
    });
  const first = await post();
  const second = await post();
  expect([first.status, second.status]).toEqual([201, 201]);
  expect(second.headers.get('idempotency-replayed')).toBe('true');
  expect(ran).toBe(1);
});
