import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import autocannon from 'autocannon';

/** Every throughput run uses these, for every contender. */
export const CONNECTIONS = 10;

export function percentile(values, p) {
  const sorted = [...values].sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

const ms3 = (value) => (Number.isFinite(value) ? Number(value.toFixed(3)) : value);

/**
 * autocannon notices that a run is over (its duration passed, its `amount` answered, `stop()`
 * called) only on its next sample tick, 1 s by default: a 0.5 s run would last 1 s, and a bounded
 * run up to 1 s past its last answer. So a timed run ticks once, at its end, and any other run
 * every TICK_MS. (The bench reads autocannon's totals, never its per-tick samples.)
 */
const TICK_MS = 50;

let runCounter = 0;
let runId = `rsbench-${process.pid}`;

/** Every key the load generator sends contains the run id, so the run can delete what it wrote. */
export function setRunId(id) {
  runId = id;
}

/**
 * One bounded autocannon run. `keyed: true` sends a fresh `Idempotency-Key` per request; otherwise
 * an `x-bench-seq` header of the same shape is set, so the load generator does the same work for
 * the baseline as for the contender. `fixedKey` sends one key on every request (replay runs).
 */
export async function load({
  url,
  method = 'POST',
  body,
  headers = {},
  keyed = false,
  fixedKey,
  durationS,
  amount,
  connections = CONNECTIONS,
}) {
  const prefix = `${runId}-${runCounter++}`;
  let seq = 0;
  const headerName = keyed ? 'idempotency-key' : 'x-bench-seq';
  const baseHeaders = { ...headers };
  if (body !== undefined) baseHeaders['content-type'] = 'application/json';
  if (fixedKey) baseHeaders['idempotency-key'] = fixedKey;
  const options = {
    url,
    method,
    connections,
    pipelining: 1,
    headers: baseHeaders,
    body: body === undefined ? undefined : JSON.stringify(body),
    timeout: 10,
    requests: [
      {
        setupRequest(request) {
          request.headers = { ...request.headers, [headerName]: `${prefix}-${seq++}` };
          return request;
        },
      },
    ],
  };
  if (amount) options.amount = amount;
  else options.duration = durationS;
  options.sampleInt = amount ? TICK_MS : durationS * 1000;
  // autocannon's own histogram has 1 ms resolution; these are the exact latencies of 2xx answers.
  const latencies = [];
  const result = await new Promise((resolve, reject) => {
    const instance = autocannon(options, (error, done) => (error ? reject(error) : resolve(done)));
    instance.on('response', (_client, statusCode, _bytes, responseTimeMs) => {
      if (statusCode < 300) latencies.push(responseTimeMs);
    });
  });
  const seconds = result.duration;
  const ok = result['2xx'];
  return {
    rps: ok / seconds,
    p50Ms: ms3(percentile(latencies, 50)),
    p99Ms: ms3(percentile(latencies, 99)),
    requests: result.requests.total,
    ok,
    non2xx: result.non2xx,
    errors: result.errors + result.timeouts,
    seconds,
  };
}

/** Sends one request and resolves with status, headers and body text. */
export function request(url, { method = 'POST', body, headers = {}, agent } = {}) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = http.request(
      url,
      {
        method,
        agent,
        headers: payload ? { 'content-type': 'application/json', ...headers } : headers,
        timeout: 30_000,
      },
      (res) => {
        const chunks = [];
        res.on('data', (chunk) => chunks.push(chunk));
        res.on('end', () =>
          resolve({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString() }),
        );
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error('request timed out')));
    req.on('error', reject);
    req.end(payload);
  });
}

/** How long a burst may take before its unanswered requests count as failures. */
const BURST_TIMEOUT_MS = 30_000;

/**
 * A burst opens its connections in waves of WAVE, pausing WAVE_PAUSE_MS between waves. A
 * connection counts as open once the kernel completes its handshake, before the server accepts
 * it; a server that falls behind (it shares the CPU) fills its accept queue (Node's backlog is
 * 511), and the SYNs past it are dropped and retried only after a second. The pause lets it catch
 * up: at load average 5 the hot key scenario's 12 bursts overflowed the queue 180-240 times
 * without it (4-5 s of retries), never with it. No pause follows the last wave, so a burst of one
 * wave (the peers' 20 duplicates) is written the moment it is open: paused, every connection was
 * accepted first, and express-idempotency's Redis adapter ran all 20 duplicates instead of 1 to 7
 * (the race changed, not just the bench's speed).
 */
const WAVE = 100;
const WAVE_PAUSE_MS = 10;

/**
 * `count` requests on `count` connections opened beforehand, then written in one go, so they all
 * reach the server before any completes and the time measured is the server's, not the TCP
 * handshakes' (1,000 simultaneous SYNs would overflow the listen backlog and wait out SYN
 * retries). Resolves with every response and the time from the first write to the last answer.
 */
export async function burst(url, count, { method = 'POST', body, headers = {} } = {}) {
  const { hostname, port, pathname } = new URL(url);
  const payload = body === undefined ? '' : JSON.stringify(body);
  const head = [`${method} ${pathname} HTTP/1.1`, `host: ${hostname}:${port}`, 'connection: close'];
  if (body !== undefined) head.push('content-type: application/json');
  head.push(`content-length: ${Buffer.byteLength(payload)}`);
  for (const [name, value] of Object.entries(headers)) head.push(`${name}: ${value}`);
  const raw = `${head.join('\r\n')}\r\n\r\n${payload}`;

  const sockets = [];
  for (let i = 0; i < count; i += WAVE) {
    const wave = Array.from({ length: Math.min(WAVE, count - i) }, () => {
      const socket = net.connect({ host: hostname, port: Number(port) });
      sockets.push(socket);
      return once(socket, 'connect');
    });
    await Promise.all(wave);
    if (i + WAVE < count) await sleep(WAVE_PAUSE_MS);
  }
  const started = performance.now();
  let last = started;
  const answers = sockets.map(
    (socket) =>
      new Promise((resolve, reject) => {
        const chunks = [];
        socket.on('data', (chunk) => chunks.push(chunk));
        socket.once('error', reject);
        socket.once('end', () => {
          last = Math.max(last, performance.now());
          const text = Buffer.concat(chunks).toString();
          const split = text.indexOf('\r\n\r\n');
          const lines = text.slice(0, split).split('\r\n');
          const status = Number(lines[0]?.split(' ')[1]);
          if (!status) return reject(new Error('connection closed without a response'));
          const responseHeaders = {};
          for (const line of lines.slice(1)) {
            const colon = line.indexOf(':');
            responseHeaders[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
          }
          resolve({ status, headers: responseHeaders, text: text.slice(split + 4) });
        });
      }),
  );
  for (const socket of sockets) socket.write(raw);
  const timer = setTimeout(() => {
    for (const socket of sockets) socket.destroy(new Error('no response within the burst timeout'));
  }, BURST_TIMEOUT_MS);
  const settled = await Promise.allSettled(answers);
  clearTimeout(timer);
  for (const socket of sockets) socket.destroy();
  return {
    drainMs: last - started,
    responses: settled.filter((s) => s.status === 'fulfilled').map((s) => s.value),
    failures: settled
      .filter((s) => s.status === 'rejected')
      .map((s) => String(s.reason?.message ?? s.reason)),
  };
}

/** Latency of `count` sequential requests with fresh keys: the cost of one request alone. */
export async function sequentialLatency(url, count, { body, keyPrefix }) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const times = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    await request(url, { body, headers: { 'idempotency-key': `${keyPrefix}-${i}` }, agent });
    times.push(performance.now() - started);
  }
  agent.destroy();
  return { p50Ms: percentile(times, 50), p99Ms: percentile(times, 99) };
}

/**
 * Keeps a keyed load running while `during()` runs, and reports throughput and latency percentiles
 * of exactly the responses that arrived meanwhile (so p99 "during a purge" covers only the purge).
 * The load is bounded by `maxS` even if `during()` never settles.
 */
export async function loadDuring({ url, body, maxS = 300, connections = CONNECTIONS }, during) {
  const prefix = `${runId}-${runCounter++}`;
  let seq = 0;
  const latencies = [];
  let measuring = false;
  let errors = 0;
  let non2xx = 0;
  let finished;
  const done = new Promise((resolve) => {
    finished = resolve;
  });
  const instance = autocannon(
    {
      url,
      method: 'POST',
      connections,
      duration: maxS,
      sampleInt: TICK_MS,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
      timeout: 10,
      requests: [
        {
          setupRequest(request) {
            request.headers = { ...request.headers, 'idempotency-key': `${prefix}-${seq++}` };
            return request;
          },
        },
      ],
    },
    () => finished(),
  );
  instance.on('response', (_client, statusCode, _bytes, responseTimeMs) => {
    if (!measuring) return;
    if (statusCode >= 300) non2xx++;
    else latencies.push(responseTimeMs);
  });
  instance.on('reqError', () => {
    if (measuring) errors++;
  });
  // Connections open and the JIT warms before the window starts.
  await new Promise((resolve) => setTimeout(resolve, 500));
  measuring = true;
  const started = performance.now();
  let value;
  try {
    value = await during();
  } finally {
    measuring = false;
    instance.stop();
  }
  const seconds = (performance.now() - started) / 1000;
  // Its connections close before the next run starts, so two loads never overlap.
  await done;
  return {
    value,
    seconds,
    rps: latencies.length / seconds,
    p50Ms: ms3(percentile(latencies, 50)),
    p99Ms: ms3(percentile(latencies, 99)),
    non2xx,
    errors,
  };
}
