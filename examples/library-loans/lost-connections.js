import cluster from 'node:cluster';
import net from 'node:net';

/** IPC: the primary hands a worker a connection that another worker died holding. */
const LOST_CONNECTION = 'loan-desk:lost-connection';

/**
 * In the primary of `WORKERS=N`. node:cluster's round robin (its default on Linux) has the primary
 * accept each connection and send it to a worker, and close its own copy once the worker says it
 * took it. A worker killed before it said so leaves the connection open in the primary, unanswered,
 * for good: the handoff (lib/internal/cluster/round_robin_handle.js, node 20) waits for a reply that
 * cannot come. So the primary notes each connection it sends (cluster's `newconn` message) and,
 * when a worker dies, sends the ones still open to a live one of `listening` (`listeningWorkers`),
 * which serves them (`takeLostConnections`).
 *
 * A node whose cluster sends connections otherwise is noted nothing here, and behaves as node does.
 */
export function rescueLostConnections(listening) {
  const inFlight = new Map();
  cluster.on('fork', (worker) => {
    const handles = new Set();
    inFlight.set(worker.id, handles);
    const send = worker.process.send;
    worker.process.send = function sendNotingConnections(message, handle, ...rest) {
      // The connections the worker took were closed by cluster (fd -1): only those in flight stay.
      for (const noted of handles) if (!(noted.fd >= 0)) handles.delete(noted);
      if (message?.act !== 'newconn' || !handle) return send.call(this, message, handle, ...rest);
      // One a closing worker refused is sent to another: it is in flight there, not here.
      for (const other of inFlight.values()) other.delete(handle);
      handles.add(handle);
      // Cluster sends without a callback, so a write to a worker dead but not yet seen dead is an
      // 'error' that ends the primary. The connection is still ours: its worker's exit rescues it.
      return send.call(this, message, handle, () => {});
    };
  });
  cluster.on('exit', (worker) => {
    const lost = [...(inFlight.get(worker.id) ?? [])].filter((handle) => handle.fd >= 0);
    inFlight.delete(worker.id);
    for (const handle of lost) {
      const heir = [...listening].find((other) => other !== worker && other.isConnected());
      // With no worker to serve it, a closed connection at least tells the client at once.
      if (heir) heir.send({ type: LOST_CONNECTION }, handle, () => handle.close());
      else handle.close();
    }
  });
}

/** In a worker: serves on `server` the connections the primary rescued from a dead worker. */
export function takeLostConnections(server) {
  process.on('message', (message, handle) => {
    if (message?.type !== LOST_CONNECTION) return;
    server.emit('connection', new net.Socket({ handle, readable: true, writable: true }));
  });
}
