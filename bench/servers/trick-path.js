// The in-process path of the tricks scenario, served by the build under TRICK_ROOT (its dist/):
//   express  a fresh-key POST /loans through an Express 5 app and retrysafe/express, no-op store
//            (lib/engine-exchange.js)
// Each build runs in a process of its own, so V8 optimizes node:http's and Express's code for that
// build's objects alone, as in a server. `time` serves `count` requests and answers µs of this
// process's CPU time per request (user + system), as the engine scenario measures.
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import express from 'express';
import { exchange, expressRoute } from '../lib/engine-exchange.js';
import { serveCommands } from '../lib/proc.js';

const root = process.env.TRICK_ROOT;
const build = (entry) => import(pathToFileURL(path.join(root, 'dist', entry)).href);

async function serverOf(kind) {
  if (kind === 'express') {
    const app = express();
    app.post('/loans', ...expressRoute((await build('adapters/express.js')).idempotency));
    return app;
  }
  throw new Error(`TRICK_PATH must be express; got ${kind}`);
}

const serve = await serverOf(process.env.TRICK_PATH);
let seq = 0;
serveCommands({
  async time({ count }) {
    const started = process.cpuUsage();
    for (let i = 0; i < count; i++) {
      const status = await exchange(serve, `k-${seq++}`);
      if (status !== 201) throw new Error(`${process.env.TRICK_PATH} answered ${status}`);
    }
    const { user, system } = process.cpuUsage(started);
    return (user + system) / count;
  },
});
process.send({ ready: 'in-process' });
process.once('SIGTERM', () => process.exit(0));
