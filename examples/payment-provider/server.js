// The payment provider the loan desk charges fines at: `npm run provider`.
// PROVIDER_PORT (8484; 0 picks a free port), PROVIDER_DB (its SQLite file, provider.db), HOST (127.0.0.1).
import { startProvider } from './provider.js';

try {
  const port = Number(process.env.PROVIDER_PORT || 8484);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`PROVIDER_PORT=${JSON.stringify(process.env.PROVIDER_PORT)} is not a port number`);
  }
  const filename = process.env.PROVIDER_DB || 'provider.db';
  const provider = await startProvider({ host: process.env.HOST || '127.0.0.1', port, filename });
  console.log(`payment provider listening on ${provider.url} (SQLite ${filename})`);
  const stop = () => provider.close().then(() => process.exit(0));
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
} catch (error) {
  console.error(`payment provider: ${error.message}`);
  process.exit(1);
}
