// @ts-check
import http from 'node:http';

/**
 * A loopback HTTP proxy that injects the faults a retrying client must survive. Plain ESM with
 * JSDoc types so both the TypeScript tests and the JavaScript demo import it as is.
 *
 * Faults, rolled with the proxy's own PRNG (seeded for reproducible runs):
 * - refuse: a new connection is reset (TCP RST) before a byte is read; the target never sees it.
 * - drop: the request is forwarded, the target's whole response is read (so the target DID process
 *   it), then the client's connection is reset instead of the response being relayed.
 * - delay: the response is relayed `delayMs` late.
 * A request carrying the `dropHeader` is dropped whatever the roll, and forwarded without it: the
 * fault a client chooses (the loan desk page's lossy-network switch).
 * Every relayed response carries `Connection: close`, so each attempt of a client arrives on its own
 * connection and the refuse roll applies per attempt, not once per pooled socket.
 *
 * @typedef {object} FaultProxyOptions
 * @property {number} targetPort the port of the real server on `targetHost`
 * @property {string} [targetHost] default `'127.0.0.1'`
 * @property {number} [refuseRate] probability in [0, 1] that a new connection is refused; default 0
 * @property {number} [dropRate] probability that a forwarded request's response is dropped; default 0
 * @property {number} [delayRate] probability that a response is delayed; default 0.
 *   `dropRate + delayRate` must be <= 1: one roll per request picks drop, delay or pass-through.
 * @property {number} [delayMs] default 100
 * @property {number} [seed] seeds the PRNG; default: `Math.random`
 * @property {string} [dropHeader] the lower-case name of a header whose requests are dropped
 *
 * @typedef {object} FaultProxyStats
 * @property {number} connections connections accepted, refused ones included
 * @property {number} refused connections reset before reading
 * @property {number} requests requests read from clients
 * @property {number} forwarded requests the target answered
 * @property {number} dropped answered requests whose response was replaced by a reset
 * @property {number} delayed responses relayed late
 * @property {number} passed responses relayed on time
 * @property {number} upstreamErrors requests the target could not be reached for (answered 502)
 *
 * @typedef {object} FaultProxy
 * @property {(port?: number, host?: string) => Promise<number>} start listens on `host` (127.0.0.1; port 0: any free port); resolves with the port
 * @property {() => Promise<void>} close stops listening and resets every open connection
 * @property {FaultProxyStats} stats live counters
 */

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'upgrade',
  'te',
  'trailer',
]);

/** @param {number} seed */
function mulberry32(seed) {
  let state = seed >>> 0;
  return function next() {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** @param {http.IncomingHttpHeaders} headers */
function endToEnd(headers) {
  /** @type {http.OutgoingHttpHeaders} */
  const out = {};
  for (const [name, value] of Object.entries(headers)) {
    if (!HOP_BY_HOP.has(name) && value !== undefined) out[name] = value;
  }
  return out;
}

/** @param {string} name @param {number | undefined} value */
function rate(name, value) {
  const resolved = value ?? 0;
  if (!(resolved >= 0 && resolved <= 1)) throw new TypeError(`fault proxy: \`${name}\` must be in [0, 1]`);
  return resolved;
}

/** @param {http.IncomingMessage} stream @returns {Promise<Buffer>} */
function readAll(stream) {
  return new Promise((resolve, reject) => {
    /** @type {Buffer[]} */
    const chunks = [];
    stream.on('data', (chunk) => chunks.push(chunk));
    stream.on('end', () => resolve(Buffer.concat(chunks)));
    stream.on('error', reject);
  });
}

/**
 * @param {FaultProxyOptions} options
 * @returns {FaultProxy}
 * @example
 * const proxy = createFaultProxy({ targetPort: 8483, dropRate: 0.3, refuseRate: 0.1, seed: 7 });
 * const port = await proxy.start();
 * // … send requests to http://127.0.0.1:${port} …
 * console.log(proxy.stats);
 * await proxy.close();
 */
export function createFaultProxy(options) {
  const targetHost = options.targetHost ?? '127.0.0.1';
  const { targetPort } = options;
  if (!Number.isInteger(targetPort) || targetPort <= 0)
    throw new TypeError('fault proxy: `targetPort` is required');
  const refuseRate = rate('refuseRate', options.refuseRate);
  const dropRate = rate('dropRate', options.dropRate);
  const delayRate = rate('delayRate', options.delayRate);
  if (dropRate + delayRate > 1) throw new TypeError('fault proxy: `dropRate + delayRate` must be <= 1');
  const delayMs = options.delayMs ?? 100;
  const random = options.seed === undefined ? Math.random : mulberry32(options.seed);
  const { dropHeader } = options;
  const agent = new http.Agent({ keepAlive: true });
  /** @type {Set<NodeJS.Timeout>} */
  const timers = new Set();

  /** @type {FaultProxyStats} */
  const stats = {
    connections: 0,
    refused: 0,
    requests: 0,
    forwarded: 0,
    dropped: 0,
    delayed: 0,
    passed: 0,
    upstreamErrors: 0,
  };

  /** @param {http.IncomingMessage} req @param {Buffer} body @returns {Promise<{status: number, headers: http.OutgoingHttpHeaders, body: Buffer}>} */
  function forward(req, body) {
    return new Promise((resolve, reject) => {
      const upstream = http.request(
        {
          host: targetHost,
          port: targetPort,
          method: req.method,
          path: req.url,
          headers: { ...endToEnd(req.headers), 'content-length': String(body.length) },
          agent,
        },
        (response) => {
          readAll(response).then(
            (responseBody) =>
              resolve({
                status: response.statusCode ?? 502,
                headers: endToEnd(response.headers),
                body: responseBody,
              }),
            reject,
          );
        },
      );
      upstream.on('error', reject);
      upstream.end(body);
    });
  }

  /** @param {http.ServerResponse} res @param {{status: number, headers: http.OutgoingHttpHeaders, body: Buffer}} answer */
  function relay(res, answer) {
    res.writeHead(answer.status, {
      ...answer.headers,
      'content-length': String(answer.body.length),
      connection: 'close',
    });
    res.end(answer.body);
  }

  const server = http.createServer(async function faultProxyRequest(req, res) {
    stats.requests++;
    // Rolled before forwarding so the sequence of faults depends only on the seed and arrival order.
    const roll = random();
    const marked = dropHeader !== undefined && req.headers[dropHeader] !== undefined;
    if (marked) delete req.headers[dropHeader];
    let answer;
    try {
      answer = await forward(req, await readAll(req));
    } catch {
      stats.upstreamErrors++;
      relay(res, {
        status: 502,
        headers: { 'content-type': 'application/json' },
        body: Buffer.from('{"error":"bad_gateway"}'),
      });
      return;
    }
    stats.forwarded++;
    if (marked || roll < dropRate) {
      stats.dropped++;
      req.socket.resetAndDestroy();
    } else if (roll < dropRate + delayRate) {
      stats.delayed++;
      const timer = setTimeout(() => {
        timers.delete(timer);
        relay(res, answer);
      }, delayMs);
      timers.add(timer);
    } else {
      stats.passed++;
      relay(res, answer);
    }
  });

  server.on('connection', (socket) => {
    stats.connections++;
    if (random() < refuseRate) {
      stats.refused++;
      socket.resetAndDestroy();
    }
  });
  server.on('clientError', (_error, socket) => socket.destroy());

  return {
    stats,
    start(port = 0, host = '127.0.0.1') {
      return new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          const address = server.address();
          resolve(typeof address === 'object' && address ? address.port : port);
        });
      });
    },
    close() {
      for (const timer of timers) clearTimeout(timer);
      timers.clear();
      return new Promise((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
        agent.destroy();
      });
    },
  };
}
