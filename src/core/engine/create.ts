import type { ClaimInput } from '../contract/index.js';
import { isIdempotencyError } from '../contract/index.js';
import type { IdempotencyOptions } from '../options/index.js';
import { resolveOptions } from '../options/index.js';
import type { IncomingRequest } from '../request/index.js';
import { fingerprint, parseIdempotencyKey, type RequestBody } from '../request/index.js';
import type { CapturedResponse } from '../response/index.js';
import { bodyTooLarge, keyInvalid, keyMissing, ResponseCollector, render } from '../response/index.js';
import type { Idempotency, IdempotencyContext, Outcome } from './adapter-contract.js';
import { claimLoop } from './claim-loop.js';

const PASS: Outcome = Object.freeze({ kind: 'pass' });

/**
 * Creates the engine adapters wrap. Options are checked here, once.
 * @example
 * const idempotency = createIdempotency({ store: sqliteStore({ filename: 'app.db' }), ttl: '7d' });
 */
export function createIdempotency<Req = unknown, Tx = unknown>(
  options: IdempotencyOptions<Req, Tx>,
): Idempotency<Req, Tx> {
  const config = resolveOptions(options);
  const { mode } = config;
  const overflow = mode === 'lease' ? 'stream' : 'drop';
  const { emit, events, execute } = claimLoop<Req, Tx>(config);
  const { rejected } = events;

  async function handle(
    request: IncomingRequest<Req>,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome> {
    if (!config.methods.has(request.method.toUpperCase())) return PASS;
    const parsed = parseIdempotencyKey(
      config.keyOf === undefined ? request.keyHeader : await config.keyOf(request.raw),
      config.bounds,
    );
    if (parsed.ok === 'absent') {
      if (!config.required) return PASS;
      return rejected(keyMissing(), 'key_missing');
    }
    if (!parsed.ok) return rejected(keyInvalid(parsed.reason), 'key_invalid');
    const { key } = parsed;
    let body: RequestBody;
    try {
      const read = request.readBody();
      body = read instanceof Promise ? await read : read;
    } catch (error) {
      if (isIdempotencyError(error)) return { kind: 'rejected', error };
      throw error;
    }
    // A parser in front may allow more than we do: what it read is held to our limit too.
    if ((body instanceof Uint8Array ? body : body.parsed).byteLength > config.maxBodyBytes) {
      return rejected(bodyTooLarge(config), 'body_too_large');
    }
    const scoped = config.scopeOf(request);
    const claim: ClaimInput = {
      scope: typeof scoped === 'string' ? scoped : await scoped,
      key,
      fingerprint: fingerprint(
        { method: request.method, path: request.path, contentType: request.contentType, body },
        config.fingerprintBody,
      ),
      leaseMs: config.leaseMs,
      ttlMs: config.ttlMs,
      timeoutMs: config.storeTimeoutMs,
    };
    return execute(claim, run, request.acceptEncoding);
  }

  return {
    mode,
    keyHeader: config.keyHeader,
    maxBodyBytes: config.maxBodyBytes,
    maxResponseBytes: config.maxResponseBytes,
    handle,
    render: (error) => render(config, error),
    // Every adapter makes this error once per oversized request, guarded or not yet known to be.
    bodyTooLarge: () => {
      const error = bodyTooLarge(config);
      if (emit) emit({ type: 'rejected', reason: 'body_too_large' });
      return error;
    },
    collect: () => new ResponseCollector(config.maxResponseBytes, overflow, config.storedHeaderNames),
  };
}
