import {
  type ClaimInput,
  ConfigError,
  type IdempotencyEventListener,
  type IdempotencyStore,
  isPhaseStore,
  type SavedStep,
  StepFencedError,
} from '../contract/index.js';
import type { BodyCipher } from '../response/index.js';
import type { ResumedRequest } from './adapter-contract.js';
import type { deadlineGuard } from './deadline.js';

/** What marks a value sealed with `encryptionKey`; anything else is JSON text. */
const SEALED = 'sealed:';
const MAX_STEP_NAME_LENGTH = 200;

/** Step results and saved requests as the store keeps them: JSON text, sealed when a key is set. */
export function stepCodec(cipher: BodyCipher | undefined) {
  const seal = (text: string) =>
    cipher ? SEALED + Buffer.from(cipher.seal(Buffer.from(text, 'utf8'))).toString('base64') : text;
  const open = (stored: string) =>
    stored.startsWith(SEALED)
      ? Buffer.from(cipher!.open(Buffer.from(stored.slice(SEALED.length), 'base64'))).toString('utf8')
      : stored;
  return {
    /** `undefined` is kept as `''`: JSON has no text for it. */
    encodeValue: (value: unknown) => seal(value === undefined ? '' : JSON.stringify(value)),
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
        }),
      ),
    decodeRequest: (stored: string, scope: string, key: string): ResumedRequest => {
      const saved = JSON.parse(open(stored)) as {
        method: string;
        path: string;
        contentType: string | null;
        body: string;
      };
      return {
        method: saved.method,
        path: saved.path,
        contentType: saved.contentType ?? undefined,
        body: Buffer.from(saved.body, 'base64'),
        scope,
        key,
      };
    },
  };
}

export type StepCodec = ReturnType<typeof stepCodec>;

function checkName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || name === '' || name.length > MAX_STEP_NAME_LENGTH) {
    throw new ConfigError(
      `retrysafe: a step name must be a string of 1 to ${MAX_STEP_NAME_LENGTH} characters`,
    );
  }
}

/**
 * The steps of one lease-mode operation: runs each unfinished step once and saves it fenced by
 * `token`; answers finished ones (a takeover's) from their saved results. `request` is saved with
 * the operation's first step, for the completer.
 */
export function leasedSteps<Tx>(
  store: IdempotencyStore,
  codec: StepCodec,
  guard: ReturnType<typeof deadlineGuard>,
  emit: IdempotencyEventListener | undefined,
  claim: ClaimInput,
  token: string,
  finished: readonly SavedStep[] | undefined,
  request: (() => string) | undefined,
) {
  const results = new Map<string, string>();
  for (const step of finished ?? []) results.set(step.name, step.value);
  // The request is on the record once any step is.
  let unsavedRequest = results.size === 0 ? request : undefined;
  const running = new Set<string>();
  const { scope, key } = claim;

  function finishedResult(name: string): { value: unknown } | undefined {
    checkName(name);
    const saved = results.get(name);
    if (saved === undefined) {
      if (running.has(name)) throw new ConfigError(`retrysafe: step '${name}' is already running`);
      return undefined;
    }
    if (emit) emit({ type: 'step_replayed', key, scope, name });
    return { value: codec.decodeValue(saved) };
  }

  /** Runs `save` (which runs the step and saves it, fenced) once and records the saved result. */
  async function settle(
    name: string,
    phase: boolean,
    save: () => Promise<{ saved: boolean; step: SavedStep | undefined }>,
  ): Promise<unknown> {
    const startMs = emit ? performance.now() : 0;
    running.add(name);
    let outcome: Awaited<ReturnType<typeof save>>;
    try {
      outcome = await save();
    } finally {
      running.delete(name);
    }
    const { saved, step } = outcome;
    if (!saved || !step) {
      if (emit) emit({ type: 'fenced', key, scope, step: 'step' });
      throw new StepFencedError(
        `retrysafe: step '${name}' was not saved: another request took key ${key} over`,
      );
    }
    unsavedRequest = undefined;
    results.set(name, step.value);
    if (emit) emit({ type: 'step_saved', key, scope, name, phase, stepMs: performance.now() - startMs });
    // What a takeover would answer: the JSON round trip of the result.
    return codec.decodeValue(step.value);
  }

  async function step<T>(name: string, fn: () => T | Promise<T>): Promise<T> {
    const done = finishedResult(name);
    if (done) return done.value as T;
    return (await settle(name, false, async () => {
      const step = { name, value: codec.encodeValue(await fn()) };
      const saving = store.saveStep(scope, key, token, step, unsavedRequest?.());
      return { saved: await guard(saving, performance.now()), step };
    })) as T;
  }

  async function phase<T>(name: string, fn: (tx: Tx) => T | Promise<T>): Promise<T> {
    const done = finishedResult(name);
    if (done) return done.value as T;
    if (!isPhaseStore(store)) {
      throw new ConfigError(
        `retrysafe: ctx.phase needs a store with phases (SQLite, PostgreSQL), not ${store.name}`,
      );
    }
    return (await settle(name, true, async () => {
      let step: SavedStep | undefined;
      const work = async (tx: unknown) => {
        step = { name, value: codec.encodeValue(await fn(tx as Tx)) };
        return step;
      };
      return { saved: await store.phase(scope, key, token, work, unsavedRequest?.()), step };
    })) as T;
  }

  return { step, phase, hasFinished: () => results.size > 0 };
}
