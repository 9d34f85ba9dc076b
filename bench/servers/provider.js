// examples/payment-provider for the bench: on a free port, reported over IPC like the other bench
// servers; DATABASE_URL is its SQLite file.
import { startProvider } from '../../examples/payment-provider/provider.js';

const provider = await startProvider({ host: '127.0.0.1', port: 0, filename: process.env.DATABASE_URL });
process.send?.({ ready: Number(new URL(provider.url).port) });
