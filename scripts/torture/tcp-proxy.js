// @ts-check
import net from 'node:net';

/**
 * A loopback TCP proxy between app processes and a database, for the torture run's link faults
 * (examples/library-loans/faults/fault-proxy.js speaks HTTP; database protocols need bytes):
 * - `delay(ms)`: every chunk from now on is relayed `ms` late, in order, both ways;
 * - `stall(ms)`: nothing is relayed for `ms` (a lossy link, TCP retransmitting), then all of it;
 * - `reset()`: every open connection is reset (RST) both ways, as a broken link or a NAT timeout.
 *
 * @typedef {object} TcpProxy
 * @property {number} port where apps connect
 * @property {(ms: number) => void} delay
 * @property {(ms: number) => void} stall
 * @property {() => number} reset resets every open connection; returns how many there were
 * @property {() => Promise<void>} close
 */

/**
 * @param {{ targetPort: number, targetHost?: string }} options
 * @returns {Promise<TcpProxy>}
 */
export async function startTcpProxy({ targetPort, targetHost = '127.0.0.1' }) {
  let delayMs = 0;
  let stalledUntilMs = 0;
  /** @type {Set<net.Socket>} */
  const sockets = new Set();

  /** Relays `from` to `to`, each chunk held until its delay or the stall has passed, order kept. */
  function relay(/** @type {net.Socket} */ from, /** @type {net.Socket} */ to) {
    let tail = Promise.resolve();
    from.on('data', (chunk) => {
      const dueMs = Math.max(Date.now() + delayMs, stalledUntilMs);
      tail = tail.then(async () => {
        const waitMs = dueMs - Date.now();
        if (waitMs > 0) await new Promise((resolve) => setTimeout(resolve, waitMs));
        if (!to.destroyed) to.write(chunk);
      });
    });
    from.on('end', () => tail.then(() => to.end()));
  }

  const server = net.createServer((client) => {
    const upstream = net.connect({ port: targetPort, host: targetHost });
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      socket.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    relay(client, upstream);
    relay(upstream, client);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const address = /** @type {net.AddressInfo} */ (server.address());
  return {
    port: address.port,
    delay: (ms) => {
      delayMs = ms;
    },
    stall: (ms) => {
      stalledUntilMs = Date.now() + ms;
    },
    reset() {
      const count = sockets.size / 2;
      for (const socket of sockets) socket.resetAndDestroy();
      return count;
    },
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(() => resolve(undefined)));
    },
  };
}
