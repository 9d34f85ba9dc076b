import { createHash } from 'node:crypto';
import {
  type ClaimInput,
  ConfigError,
  isPhaseStore,
  type SavedStep,
  StepFencedError,
} from '../contract/index.js';
import type { IdempotencyContext } from './adapter-contract.js';
import type { Engine } from './state.js';

const MAX_STEP_NAME_LENGTH = 200;

/** How a context runs steps: lease mode saves each one (`leasedSteps`); atomic mode commits all at once. */
export type StepMethods<Tx> = Pick<IdempotencyContext<Tx>, 'step' | 'phase'>;

/** What the handler is told about its request; `tx` is the atomic store's transaction. */
export function handlerContext<Tx>(
  claim: ClaimInput,
  tx: Tx | undefined,
  steps: StepMethods<Tx>,
): IdempotencyContext<Tx> {
  const downstreamKey = (purpose: string) =>
    createHash('sha256').update(`${claim.scope}\n${claim.key}\n${purpose}`).digest('base64url');
  return {
    key: claim.key,
    scope: claim.scope,
    fingerprint: claim.fingerprint,
    tx,
    downstreamKey,
    step: steps.step,
    phase: steps.phase,
    stepKey: (name) => downstreamKey(`step:${name}`),
  };
}

/**
 * Atomic mode's steps: the whole operation, steps included, commits in one transaction, so a step
 * is simply run (a phase on that transaction).
 */
export function atomicSteps<Tx>(tx: Tx): StepMethods<Tx> {
  return {
    step: async (_name, fn) => fn(),
    phase: async (_name, fn) => fn(tx),
  };
}

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
export function leasedSteps<Req, Tx>(
  { config: { store }, codec, guard, emit }: Engine<Req>,
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
        `retrysafe: ctx.phase needs a store with phases (SQLite, PostgreSQL, MySQL/MariaDB, an ORM's store), not ${store.name}`,
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
