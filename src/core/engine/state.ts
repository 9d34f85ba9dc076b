import type { ClaimInput, IdempotencyEventListener } from '../contract/index.js';
import { safeListener } from '../contract/index.js';
import type { ResolvedOptions } from '../options/index.js';
import type { BodyCipher } from '../response/index.js';
import type { ResumedRequest } from './adapter-contract.js';
import { breakerOf, type StoreBreaker } from './breaker.js';
import { deadlineGuard } from './deadline.js';
import { leaseKeeper } from './lease-keeper.js';

/**
 * What every engine function runs over, built once from the resolved options and frozen: one
 * value handed down instead of each part of the state machine closing over its own copies.
 */
export interface Engine<Req = unknown> {
  readonly config: ResolvedOptions<Req>;
  /**
   * `config.onEvent`, made safe. Every use is behind `if (emit)`: without a listener no event is
   * built and the clock is read only where a timeout or a lease needs it.
   */
  readonly emit: IdempotencyEventListener | undefined;
  /** Bounds every store call by `storeTimeout`. */
  readonly guard: ReturnType<typeof deadlineGuard>;
  /** The store's circuit breaker (shared with every engine on the store); `undefined` when off. */
  readonly breaker: StoreBreaker | undefined;
  /** Renews the leases of running handlers (lease mode). */
  readonly leases: ReturnType<typeof leaseKeeper>;
  readonly codec: StepCodec;
}

export function engineState<Req>(config: ResolvedOptions<Req>): Engine<Req> {
  const { store, storeTimeoutMs } = config;
  const emit = config.onEvent && safeListener(config.onEvent);
  return Object.freeze({
    config,
    emit,
    guard: deadlineGuard(storeTimeoutMs, `${store.name} store did not answer within ${storeTimeoutMs} ms`),
    breaker: config.breaker && breakerOf(store, config.breaker),
    leases: leaseKeeper(store, config.leaseMs, emit),
    codec: stepCodec(config.cipher),
  });
}

/** The store's claim of `key` in `scope`, with the engine's lease, retention and timeout. */
export function claimInput<Req>(
  engine: Engine<Req>,
  scope: string,
  key: string,
  fingerprint: string,
): ClaimInput {
  const { leaseMs, ttlMs, storeTimeoutMs } = engine.config;
  return { scope, key, fingerprint, leaseMs, retainMs: ttlMs, timeoutMs: storeTimeoutMs };
}

/** What marks a value sealed with `encryptionKey`; anything else is JSON text. */
const SEALED = 'sealed:';

/** Step results and saved requests as the store keeps them: JSON text, sealed when a key is set. */
function stepCodec(cipher: BodyCipher | undefined) {
  const seal = (text: string) =>
    cipher ? SEALED + Buffer.from(cipher.seal(Buffer.from(text, 'utf8'))).toString('base64') : text;
  const open = (stored: string) =>
    stored.startsWith(SEALED)
      ? Buffer.from(cipher!.open(Buffer.from(stored.slice(SEALED.length), 'base64'))).toString('utf8')
      : stored;
  return {
    /** A step result's JSON text (`''` for `undefined`, which JSON has no text for), as stored. */
    encodeText: seal,
    decodeValue: (stored: string): unknown => {
      const text = open(stored);
      return text === '' ? undefined : JSON.parse(text);
    },
    encodeRequest: (request: Omit<ResumedRequest, 'scope' | 'key'>) =>
      seal(
        JSON.stringify({
          method: request.method,
          path: request.path,
          contentType: request.contentType ?? null,
          body: Buffer.from(request.body).toString('base64'),
          ...(request.route === undefined ? {} : { route: request.route }),
        }),
      ),
    decodeRequest: (stored: string, scope: string, key: string): ResumedRequest => {
      const saved = JSON.parse(open(stored)) as {
        method: string;
        path: string;
        contentType: string | null;
        body: string;
        route?: string;
      };
      return {
        method: saved.method,
        path: saved.path,
        contentType: saved.contentType ?? undefined,
        body: Buffer.from(saved.body, 'base64'),
        route: saved.route,
        scope,
        key,
      };
    },
  };
}

export type StepCodec = ReturnType<typeof stepCodec>;
