import { createHash } from 'node:crypto';
import {
  type ClaimInput,
  ConfigError,
  isPhaseStore,
  type SavedStep,
  StepFencedError,
} from '../contract/index.js';
import { jsonProblem } from '../jobs/json-value.js';
import type { IdempotencyContext } from './adapter-contract.js';
import type { Journey } from './journey-state.js';

const MAX_STEP_NAME_LENGTH = 200;

/**
 * The engine's own steps are named `retrysafe:…`: each completer takeover saves one,
 * `retrysafe:resume:N`, so that every process counts an operation's resumes alike (`maxResumes`).
 */
const ENGINE_STEP_PREFIX = 'retrysafe:';
const RESUME_STEP_PREFIX = `${ENGINE_STEP_PREFIX}resume:`;

/** How many times the completer took the operation of these finished steps over. */
export function resumesOf(finished: readonly SavedStep[] | undefined): number {
  let resumes = 0;
  for (const step of finished ?? []) if (step.name.startsWith(RESUME_STEP_PREFIX)) resumes++;
  return resumes;
}

/** The step a completer saves as it takes an operation over for the `resumes`th time. */
export const resumeStep = (resumes: number, value: string): SavedStep => ({
  name: `${RESUME_STEP_PREFIX}${resumes}`,
  value,
});

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
  const used = new Set<string>();
  const use = (name: string) => {
    checkName(name);
    if (used.has(name)) throw reused(name);
    used.add(name);
  };
  return {
    step: async (name, fn) => {
      use(name);
      return fn();
    },
    phase: async (name, fn) => {
      use(name);
      return fn(tx);
    },
  };
}

function checkName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || name === '' || name.length > MAX_STEP_NAME_LENGTH) {
    throw new ConfigError(
      `retrysafe: a step name must be a string of 1 to ${MAX_STEP_NAME_LENGTH} characters`,
    );
  }
  if (name.startsWith(ENGINE_STEP_PREFIX)) {
    throw new ConfigError(`retrysafe: step names starting with '${ENGINE_STEP_PREFIX}' are the engine's`);
  }
}

// A second step of one name in one execution would answer the first one's result without running
// (a loop charging three items under one name charged one): each step needs a name of its own.
const reused = (name: string) =>
  new ConfigError(
    `retrysafe: step '${name}' already ran in this execution: give each step its own name (e.g. \`charge:\${item}\`)`,
  );

/**
 * The JSON text step `name`'s result is saved as (`''` for `undefined`). A value JSON would not
 * give back as itself (a BigInt, a cycle, a function, NaN, a Map, a Date) or past `maxBytes` is
 * refused before anything is saved: the step throws, and the operation resumes at it.
 */
function stepText(name: string, value: unknown, maxBytes: number): string {
  if (value === undefined) return '';
  const problem = jsonProblem(value);
  if (problem !== undefined) {
    throw new ConfigError(
      `retrysafe: step '${name}' returned a value JSON cannot save as it is: ${problem.replace('$', 'its result')}; nothing was saved`,
    );
  }
  const text = JSON.stringify(value);
  const bytes = Buffer.byteLength(text);
  if (bytes > maxBytes) {
    throw new ConfigError(
      `retrysafe: step '${name}' returned ${bytes} bytes of JSON, over maxStepBytes ${maxBytes}; nothing was saved`,
    );
  }
  return text;
}

/**
 * The steps of one lease-mode operation: runs each unfinished step once and saves it fenced by
 * the journey's token; answers finished ones (a takeover's) from their saved results. The request
 * is saved with the operation's first step, for the completer.
 */
export function leasedSteps<Req, Tx>(journey: Journey<Req, Tx>) {
  const {
    engine: {
      config: { store, maxStepBytes },
      codec,
      guard,
      emit,
    },
    claim: { scope, key },
    token,
    finished,
  } = journey;
  const results = new Map<string, string>();
  for (const step of finished ?? []) results.set(step.name, step.value);
  // The request is on the record once any step is.
  let unsavedRequest = results.size === 0 ? journey.encodeRequest : undefined;
  const running = new Set<string>();
  // Steps this execution ran or replayed: a takeover replays each finished step once.
  const used = new Set<string>();

  function finishedResult(name: string): { value: unknown } | undefined {
    checkName(name);
    if (used.has(name)) throw reused(name);
    const saved = results.get(name);
    if (saved === undefined) {
      if (running.has(name)) throw new ConfigError(`retrysafe: step '${name}' is already running`);
      return undefined;
    }
    used.add(name);
    journey.stepReplayed(name);
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
      journey.fenced('step');
      throw new StepFencedError(
        `retrysafe: step '${name}' was not saved: another request took key ${key} over`,
      );
    }
    unsavedRequest = undefined;
    used.add(name);
    results.set(name, step.value);
    if (emit) journey.stepSaved(name, phase, performance.now() - startMs);
    // What a takeover would answer: the JSON round trip of the result.
    return codec.decodeValue(step.value);
  }

  async function step<T>(name: string, fn: () => T | Promise<T>): Promise<T> {
    const done = finishedResult(name);
    if (done) return done.value as T;
    return (await settle(name, false, async () => {
      const step = { name, value: codec.encodeText(stepText(name, await fn(), maxStepBytes)) };
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
        step = { name, value: codec.encodeText(stepText(name, await fn(tx as Tx), maxStepBytes)) };
        return step;
      };
      return { saved: await store.phase(scope, key, token, work, unsavedRequest?.()), step };
    })) as T;
  }

  return { step, phase, hasFinished: () => results.size > 0 };
}
