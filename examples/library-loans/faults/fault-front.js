import { createFaultProxy } from './fault-proxy.js';

/** The header the page sets on an attempt whose answer is to be lost (pages/desk.js). */
export const LOSE_ANSWER_HEADER = 'x-demo-lose-response';

/** `DEMO_FAULTS=1`: the desk itself listens behind the fault proxy, on loopback, on any free port. */
export const behindFaultFront = (config) => ({ ...config, host: '127.0.0.1', port: 0 });

/**
 * `DEMO_FAULTS=1`: a fault proxy (fault-proxy.js) on the desk's `host` and `port`, in front of the
 * desk on `deskPort`. A request carrying {@link LOSE_ANSWER_HEADER} reaches the desk, which lends
 * the book and commits the key's answer, and the answer is lost on the way back: the proxy resets
 * the connection, as a dropped network would. Everything else passes through, each answer with
 * `Connection: close`. Only the page's retry, with the same key, can get the loan back.
 */
export async function startFaultFront({ host, port }, deskPort) {
  const proxy = createFaultProxy({ targetPort: deskPort, dropHeader: LOSE_ANSWER_HEADER });
  return { port: await proxy.start(port, host), close: () => proxy.close() };
}
