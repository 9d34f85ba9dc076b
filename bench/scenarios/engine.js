import { IncomingMessage, ServerResponse } from 'node:http';
import { Duplex } from 'node:stream';
import { idempotency } from 'retrysafe/node';
import { median } from '../lib/load.js';
import { round2, target } from '../lib/measure.js';

/**
 * µs per keyed request that the engine and the node adapter add over the bare handler, with a
 * store that answers at once (so no database is measured): both handlers run in this process on
 * real IncomingMessage/ServerResponse objects whose socket discards what is written.
 */
const noopStore = {
  name: 'noop',
  claim: async () => ({ outcome: 'acquired', token: 't' }),
  complete: async () => true,
  release: async () => true,
  renew: async () => true,
  wait: async () => undefined,
  purgeExpired: async () => 0,
  close: async () => undefined,
};

const BODY = Buffer.from(JSON.stringify({ member: 'U-1001', isbn: 'K-01', issuedAt: '2026-11-29' }));
const ANSWER = JSON.stringify({ id: 1, member: 'U-1001', isbn: 'K-01', issuedAt: '2026-11-29' });

function handler(_req, res) {
  res.writeHead(201, { 'content-type': 'application/json; charset=utf-8', location: '/loans/1' });
  res.end(ANSWER);
}

/** Reads the body as the adapter does, so the bare run pays for it too. */
function bareHandler(req, res) {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => handler(req, res));
}

/** A socket that never closes and discards what is written to it. */
const sink = () =>
  new Duplex({
    read() {},
    write: (_chunk, _encoding, done) => done(),
    writev: (_chunks, done) => done(),
  });

function exchange(serve, key) {
  const socket = sink();
  const req = new IncomingMessage(socket);
  req.method = 'POST';
  req.url = '/loans';
  req.rawHeaders = ['Content-Type', 'application/json', 'Idempotency-Key', key];
  req.headers = { 'content-type': 'application/json', 'idempotency-key': key };
  req.push(BODY);
  req.push(null);
  req.complete = true; // as the HTTP parser leaves a fully received request
  const res = new ServerResponse(req);
  res.assignSocket(socket);
  // A response whose socket closes right after its last write emits 'close' rather than 'finish'.
  return new Promise((resolve) => {
    res.once('finish', resolve);
    res.once('close', resolve);
    serve(req, res);
  });
}

async function timePerRequest(serve, count, tag) {
  const started = process.hrtime.bigint();
  for (let i = 0; i < count; i++) await exchange(serve, `${tag}-${i}`);
  return Number(process.hrtime.bigint() - started) / 1000 / count;
}

export async function run(ctx) {
  const guarded = idempotency({ store: noopStore })(handler);
  const count = ctx.quick ? 5_000 : 20_000;
  const rounds = ctx.quick ? 3 : 7;
  await timePerRequest(bareHandler, count, 'warm-bare');
  await timePerRequest(guarded, count, 'warm-keyed');
  const bare = [];
  const keyed = [];
  for (let round = 0; round < rounds; round++) {
    bare.push(await timePerRequest(bareHandler, count, `bare-${round}`));
    keyed.push(await timePerRequest(guarded, count, `keyed-${round}`));
    ctx.log(
      `  round ${round + 1}/${rounds}: bare ${round2(bare.at(-1))} µs, keyed ${round2(keyed.at(-1))} µs`,
    );
  }
  const added = median(keyed.map((k, i) => k - bare[i]));
  return {
    title: 'Engine: µs per keyed request through the engine + node adapter, no-op store',
    table: {
      columns: ['bare handler µs', 'guarded µs', 'added µs'],
      rows: [[round2(median(bare)), round2(median(keyed)), round2(added)]],
    },
    notes: [
      `${rounds} rounds of ${count} sequential requests each, alternating bare and guarded, in one process on real IncomingMessage/ServerResponse objects; medians. No network and no database: what is left is the engine and the adapter.`,
    ],
    targets: [target('engine: µs added per keyed request (no-op store)', added, '<=', 15)],
    raw: { bare, keyed },
  };
}
