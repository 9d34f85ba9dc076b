import { fork } from 'node:child_process';
import { once } from 'node:events';
import net from 'node:net';

/**
 * How long a server may take to start before the contender is reported as failed: generous, as
 * a dozen may start side by side on a shared machine.
 */
const START_TIMEOUT_MS = 60_000;

/** A free loopback port, for servers (the loan desk) that take `PORT` rather than reporting one. */
export async function freePort() {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port;
}

async function waitForPort(port, child, deadlineMs) {
  while (Date.now() < deadlineMs) {
    if (child.exitCode !== null) throw new Error(`server exited with code ${child.exitCode}`);
    const ok = await new Promise((resolve) => {
      const socket = net.connect({ port, host: '127.0.0.1' });
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (ok) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`server did not listen on ${port} in time`);
}

/**
 * Starts `script` in its own Node process so the server never shares an event loop with the load
 * generator (`execPath` may be a wrapper, valgrind, whose `execArgv` end with Node's path). A bench server reports its port over IPC (`{ ready: port }`); any other server
 * (the loan desk) is given `PORT` and polled until it accepts connections.
 */
export async function startServer(
  script,
  {
    env = {},
    execArgv = [],
    execPath = process.execPath,
    ipcReady = true,
    startTimeoutMs = START_TIMEOUT_MS,
  } = {},
) {
  const port = ipcReady ? 0 : await freePort();
  const stderr = [];
  const child = fork(script, [], {
    env: { ...process.env, HOST: '127.0.0.1', PORT: String(port), NODE_ENV: 'production', ...env },
    execArgv,
    execPath,
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
  });
  child.stderr.on('data', (chunk) => {
    stderr.push(chunk);
    if (stderr.length > 50) stderr.shift();
  });
  const deadlineMs = Date.now() + startTimeoutMs;
  let actualPort = port;
  try {
    if (ipcReady) {
      actualPort = await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('server did not report ready')), startTimeoutMs);
        child.on('message', function onReady(message) {
          if (message?.ready) {
            clearTimeout(timer);
            child.off('message', onReady);
            resolve(message.ready);
          } else if (message?.failed) {
            clearTimeout(timer);
            reject(new Error(message.failed));
          }
        });
        child.once('exit', (code) => {
          clearTimeout(timer);
          reject(new Error(`server exited with code ${code}`));
        });
      });
    } else {
      await waitForPort(port, child, deadlineMs);
    }
  } catch (error) {
    child.kill('SIGKILL');
    const detail = Buffer.concat(stderr).toString().trim().split('\n').slice(-5).join(' | ');
    throw new Error(`${script}: ${error.message}${detail ? ` (${detail})` : ''}`);
  }
  return {
    child,
    port: actualPort,
    url: `http://127.0.0.1:${actualPort}`,
    stderr: () => Buffer.concat(stderr).toString(),
    /** Sends a message to a bench server and resolves with its reply. */
    ask(message, timeoutMs = 600_000) {
      return new Promise((resolve, reject) => {
        // A server that died (or was killed) rejects the question instead of taking the run down
        // with an unhandled ERR_IPC_CHANNEL_CLOSED: the scenario fails, the others still report.
        const settle = (error, value) => {
          clearTimeout(timer);
          child.off('message', onReply);
          child.off('exit', onExit);
          if (error) reject(error);
          else resolve(value);
        };
        const timer = setTimeout(() => settle(new Error(`no reply to ${message.cmd}`)), timeoutMs);
        const onReply = (reply) => {
          if (reply?.reply !== message.cmd) return;
          settle(reply.error ? new Error(reply.error) : undefined, reply.value);
        };
        const onExit = (code, signal) =>
          settle(new Error(`${script} exited (${signal ?? code}) before replying to ${message.cmd}`));
        if (child.exitCode !== null || child.signalCode !== null || !child.connected) {
          onExit(child.exitCode, child.signalCode);
          return;
        }
        child.on('message', onReply);
        child.once('exit', onExit);
        child.send(message, (error) => error && settle(error));
      });
    },
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/**
 * Runs every `start()` side by side (start-up is mostly idle time, not load; the servers are
 * measured one at a time afterwards) and resolves once each has started or failed: the servers
 * by `id`, and the error message of each one that failed.
 */
export async function startAll(starts) {
  const servers = new Map();
  const failed = new Map();
  await Promise.all(
    starts.map(async ({ id, start }) => {
      try {
        servers.set(id, await start());
      } catch (error) {
        failed.set(id, error.message);
      }
    }),
  );
  return { servers, failed };
}

/** Stops every server of a `startAll()` map, side by side. */
export async function stopAll(servers) {
  await Promise.all([...servers.values()].map((server) => server.stop()));
}

/** Runs a bench server's answers to `ask()`: `handlers[cmd](message)` may be async. */
export function serveCommands(handlers) {
  process.on('message', async (message) => {
    const handler = handlers[message?.cmd];
    if (!handler) return;
    try {
      process.send({ reply: message.cmd, value: await handler(message) });
    } catch (error) {
      process.send({ reply: message.cmd, error: String(error?.stack ?? error) });
    }
  });
}
