import { promiseHooks } from 'node:v8';

/** What a stretch of work cost the microtask queue: promises made, and reaction jobs run. */
export interface PromiseTurns {
  /** Promises created (each `async` call, `await` of a non-promise, `.then`, `new Promise`). */
  promises: number;
  /** Promise reaction jobs run: the microtask turns an `await` or `.then` callback takes. */
  reactions: number;
}

/**
 * Counts the promises created and the reaction jobs run in this process until `work` resolves:
 * deterministic for the same code on the same input, unlike its time, so a change that adds a
 * turn shows as a different count. Nothing else may run in the process meanwhile.
 */
export async function countTurns(work: () => Promise<unknown>): Promise<PromiseTurns> {
  const turns: PromiseTurns = { promises: 0, reactions: 0 };
  const stop = promiseHooks.createHook({
    init() {
      turns.promises++;
    },
    before() {
      turns.reactions++;
    },
  });
  try {
    await work();
  } finally {
    stop();
  }
  return turns;
}
