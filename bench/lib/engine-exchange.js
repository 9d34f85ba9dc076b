import {
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import { exchange as exchangeOn } from './exchange.js';

/**
 * The exchange the engine scenario times and bench/count-engine.js counts: one fully received
 * POST /loans on real IncomingMessage/ServerResponse objects whose socket discards what is
 * written, served by a bare handler or by the node adapter over a store that answers at once.
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

/**
 * Requests per slice of a round. The contenders take turns slice by slice, so a burst of load
 * from the rest of a shared machine (or a GC pause) lands on all of them rather than on one.
 */
export const SLICE = 250;

/** Serves one request with `serve`; resolves when the response is done. */
export const exchange = (serve, key) => exchangeOn(serve, key, BODY);

/** The guarded handler of a build's `idempotency` (node adapter), over a store that answers at once. */
const guarded = (idempotency) => idempotency({ store: noopStore })(handler);

/** The loan handler behind a build's Express `idempotency` middleware, over the no-op store. */
export const expressRoute = (idempotency) => [idempotency({ store: noopStore }), handler];

/**
 * The four handlers the engine scenario compares, built from a build's `idempotency` (node
 * adapter) and `idempotencyTelemetry` (otel): the bare handler, the guarded one, the guarded one
 * with an `onEvent` that counts events by type, and the guarded one with `retrysafe/otel` on the
 * OpenTelemetry SDK's meter provider (in memory; its reader never exports during a run).
 */
export function contenders({ idempotency, idempotencyTelemetry }) {
  const counts = {};
  const meterProvider = new MeterProvider({
    readers: [
      new PeriodicExportingMetricReader({
        exporter: new InMemoryMetricExporter(),
        exportIntervalMillis: 3_600_000,
      }),
    ],
  });
  return {
    bare: bareHandler,
    keyed: guarded(idempotency),
    events: idempotency({
      store: noopStore,
      onEvent: (event) => {
        counts[event.type] = (counts[event.type] ?? 0) + 1;
      },
    })(handler),
    otel: idempotency({ store: noopStore, onEvent: idempotencyTelemetry({ meterProvider }) })(handler),
  };
}
