/**
 * Opens the loan database named by the config (`sqlite.js`, `postgres.js` or `mysql.js`, same interface) and
 * the idempotency store the keys live in. Drivers load only when used, as a user's install has
 * only the one it needs.
 */
export async function openDatabase(config, { setup }) {
  if (config.database.kind === 'postgres') {
    const { openPostgres } = await import('./postgres.js');
    return openPostgres({ ...config.database, setup });
  }
  if (config.database.kind === 'mysql') {
    const { openMysql } = await import('./mysql.js');
    return openMysql({ ...config.database, setup });
  }
  const { openSqlite } = await import('./sqlite.js');
  return openSqlite({ ...config.database, setup });
}

/** The keys' store: the database's own (atomic mode possible), or memory or Redis (lease mode). */
export async function openKeyStore(config, database) {
  switch (config.keys.kind) {
    case 'database':
      return database.store;
    case 'memory': {
      const { memoryStore } = await import('retrysafe/memory');
      return memoryStore();
    }
    case 'redis': {
      const { redisStore } = await import('retrysafe/redis');
      return redisStore({ url: config.keys.url, prefix: config.keys.prefix });
    }
    case 'redis-cluster': {
      const { redisStore } = await import('retrysafe/redis');
      return redisStore({ clusterNodes: config.keys.clusterNodes, prefix: config.keys.prefix });
    }
  }
}
