import { spawn } from 'node:child_process';
import { ROOT } from './loan-desk.js';

/**
 * Holds a SQLite file's write lock (`BEGIN IMMEDIATE`) from another process for `holdMs`, as a
 * long batch job would; resolves once it holds the lock. Another process, because better-sqlite3
 * may wait for a lock synchronously, which in this one would also hold up the timer releasing it.
 */
export async function holdSqliteWriteLock(
  filename: string,
  holdMs: number,
): Promise<{ released: Promise<void> }> {
  const script = `const db = require('better-sqlite3')(process.argv[1]);
    db.exec('BEGIN IMMEDIATE');
    console.log('locked');
    setTimeout(() => { db.exec('ROLLBACK'); db.close(); }, Number(process.argv[2]));`;
  const child = spawn(process.execPath, ['-e', script, filename, String(holdMs)], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    exited.then((code) => reject(new Error(`the SQLite locker exited (${code}) before locking`)));
  });
  return {
    released: exited.then((code) => {
      if (code !== 0) throw new Error(`the SQLite locker exited (${code})`);
    }),
  };
}
