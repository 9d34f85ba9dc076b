import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import { type Driver, pragmaValue, walFile } from './driver.js';

// The checkpointer's thread: its own connection to the file, a PASSIVE checkpoint per message.
const CHECKPOINTER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const driver = require(workerData.driver);
const db =
  workerData.driver === 'node:sqlite' ? new driver.DatabaseSync(workerData.filename) : new driver(workerData.filename);
db.exec('PRAGMA busy_timeout = 1000');
parentPort.on('message', () => {
  try {
    db.exec('PRAGMA wal_checkpoint(PASSIVE)');
  } catch {
    // The next checkpoint (or the serving connection's own, after the purge) catches up.
  }
  parentPort.postMessage(null);
});`;

/**
 * A purge writes hundreds of WAL pages a batch, so SQLite's auto-checkpoint (every 1,000 pages)
 * ran on the serving connection every few batches: a 4 MB copy and an fsync on the event loop,
 * charged to whichever request or batch committed past the mark (p99 ×4 during a 1M purge).
 * While a purge runs, a connection of its own on a worker thread checkpoints after every batch
 * instead, and the serving connection's auto-checkpoint is off. `undefined` for a database with no
 * WAL file (in memory, another journal mode).
 */
export function walCheckpointer(db: Driver) {
  const filename = walFile(db);
  if (!filename) return undefined;
  const autoCheckpoint = pragmaValue(db, 'wal_autocheckpoint') as number;
  db.exec('PRAGMA wal_autocheckpoint = 0');
  const driver =
    db.name === 'node:sqlite' ? 'node:sqlite' : createRequire(import.meta.url).resolve('better-sqlite3');
  const worker = new Worker(CHECKPOINTER_SOURCE, { eval: true, workerData: { driver, filename } });
  worker.unref();
  let failed = false;
  let pending: (() => void) | undefined;
  const settle = () => {
    const done = pending;
    pending = undefined;
    done?.();
  };
  worker.on('message', settle);
  worker.on('error', () => {
    failed = true;
    settle();
  });
  return {
    /** Resolves once the WAL written so far is checkpointed (at once if the thread failed). */
    checkpoint(): Promise<void> {
      if (failed) return Promise.resolve();
      return new Promise<void>((resolve) => {
        pending = resolve;
        worker.postMessage(null);
      });
    },
    async close(): Promise<void> {
      await worker.terminate();
      try {
        db.exec(`PRAGMA wal_autocheckpoint = ${autoCheckpoint}`);
      } catch {
        // The connection was closed meanwhile: nothing is left to restore.
      }
    },
  };
}
