import { createHash } from 'node:crypto';
import type { ClaimInput } from '../contract/index.js';
import type { IdempotencyContext } from './adapter-contract.js';

/** How a context runs steps: lease mode saves each one (`leasedSteps`); atomic mode commits all at once. */
export type StepMethods<Tx> = Pick<IdempotencyContext<Tx>, 'step' | 'phase'>;

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
