// `npm run purge`: deletes the keys whose retention has passed, now, in bounded batches (the desk
// also does this on its PURGE_INTERVAL timer). Reads the same environment as the desk.
import { describe, readConfig } from './config.js';
import { openDatabase, openKeyStore } from './databases/index.js';

try {
  const config = readConfig();
  // No setup: a mistyped DATABASE_URL fails here instead of creating an empty database to purge.
  const database = await openDatabase(config, { setup: false });
  const store = await openKeyStore(config, database);
  try {
    const purged = await store.purgeExpired();
    console.log(`purged ${purged} expired key${purged === 1 ? '' : 's'} (${describe(config)})`);
  } finally {
    if (store !== database.store) await store.close();
    await database.close();
  }
} catch (error) {
  console.error(`purge: ${error.message}`);
  process.exitCode = 1;
}
