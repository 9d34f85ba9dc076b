import cluster from 'node:cluster';

/**
 * In the primary of `WORKERS=N`: the workers whose desk listens, kept as they start, disconnect and
 * exit. Only they serve a connection or answer a question; one just forked would not, yet.
 */
export function listeningWorkers() {
  const listening = new Set();
  cluster.on('listening', (worker) => listening.add(worker));
  const leave = (worker) => listening.delete(worker);
  cluster.on('disconnect', leave);
  cluster.on('exit', leave);
  return listening;
}
