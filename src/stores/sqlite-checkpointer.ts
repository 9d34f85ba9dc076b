import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import type Database from 'better-sqlite3';

/** What `PRAGMA wal_checkpoint` answers: frames in the WAL, and how many of them are in the database file. */
export interface CheckpointResult {
  busy: number;
  log: number;
  checkpointed: number;
}

/** A connection of its own on a worker thread that copies the WAL into the database file. */
export interface Checkpointer {
  /** One PASSIVE checkpoint (it never waits for a lock); they run one after another. */
  checkpoint(): Promise<CheckpointResult>;
  close(): Promise<void>;
}

// CommonJS run by `eval`: no file to ship next to the compiled module, and the driver is the
// path the main thread resolved.
const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const Database = require(workerData.driver);
const db = new Database(workerData.filename, { fileMustExist: true });
parentPort.on('message', (command) => {
  if (command === 'close') {
    db.close();
    parentPort.close();
    return;
  }
  const [result] = db.pragma('wal_checkpoint(PASSIVE)');
  parentPort.postMessage(result);
});`;

/**
 * A checkpointer for `db`'s file, or undefined when `db` has no WAL in a file to copy from (an
 * in-memory or temporary database, another journal mode).
 */
export function walCheckpointer(db: Database.Database): Checkpointer | undefined {
  if (db.pragma('journal_mode', { simple: true }) !== 'wal') return undefined;
  // The main database's absolute path ('' for an in-memory or temporary one).
  const { file: filename } = (db.pragma('database_list') as { name: string; file: string }[]).find(
    (entry) => entry.name === 'main',
  )!;
  if (!filename) return undefined;
  const driver = createRequire(import.meta.url).resolve('better-sqlite3');
  const worker = new Worker(WORKER_SOURCE, { eval: true, workerData: { driver, filename } });
  const waiting: { resolve: (result: CheckpointResult) => void; reject: (error: Error) => void }[] = [];
  let failure: Error | undefined;
  worker.on('message', (result: CheckpointResult) => waiting.shift()?.resolve(result));
  const fail = (error: Error) => {
    failure ??= error;
    for (const pending of waiting.splice(0)) pending.reject(failure);
  };
  worker.on('error', fail);
  const exited = new Promise<void>((resolve) =>
    worker.once('exit', () => {
      fail(new Error('sqliteStore: the WAL checkpointer thread has exited'));
      resolve();
    }),
  );
  return {
    checkpoint() {
      if (failure) return Promise.reject(failure);
      return new Promise((resolve, reject) => {
        waiting.push({ resolve, reject });
        worker.postMessage('checkpoint');
      });
    },
    async close() {
      worker.postMessage('close');
      await exited;
    },
  };
}
