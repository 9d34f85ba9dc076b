import type { AbandonedRecord, IdempotencyStore } from '../contract/index.js';
import { type Duration, timerMs, toMs } from '../options/index.js';

/** Options of {@link resumeAbandoned} and {@link startCompleter}. */
export interface CompleterOptions {
  /** The store the guarded handlers save to. */
  store: IdempotencyStore;
  /**
   * Re-drives one abandoned record through the application's guarded handler, e.g. the node
   * adapter's `guarded.resume`, or `engine.resume(record, run)`. It claims the record with the
   * normal fencing, so of many processes resuming one record, one runs it.
   */
  resume: (record: AbandonedRecord) => Promise<unknown>;
  /**
   * The most records resumed per pass.
   * @default 100
   */
  batchSize?: number;
  /** Hears a pass's failure (the store, or a `resume` that threw); the completer carries on. */
  onError?: (error: unknown) => void;
}

/** Options of {@link startCompleter}. */
export interface StartCompleterOptions extends CompleterOptions {
  /**
   * Time between passes. An abandoned operation is finished within one lease plus this.
   * @default '5s'
   */
  interval?: Duration;
}

/**
 * One completer pass: resumes, one after another, the records `store.abandoned` lists (in progress,
 * lease passed, a saved request). Resolves with how many it handed to `resume`.
 * @example
 * await resumeAbandoned({ store, resume: (record) => guarded.resume(record) });
 */
export async function resumeAbandoned(options: CompleterOptions): Promise<number> {
  const records = await options.store.abandoned({ limit: options.batchSize ?? 100 });
  for (const record of records) {
    try {
      await options.resume(record);
    } catch (error) {
      options.onError?.(error);
    }
  }
  return records.length;
}

/**
 * Runs {@link resumeAbandoned} every `interval` (an unref'd timer; passes never overlap) until
 * `stop()`, which resolves once the pass under way has ended.
 * @example
 * const completer = startCompleter({ store, resume: (record) => guarded.resume(record), interval: '2s' });
 * process.on('SIGTERM', () => completer.stop());
 */
export function startCompleter(options: StartCompleterOptions): { stop(): Promise<void> } {
  const intervalMs = toMs('interval', options.interval ?? '5s', { min: 1 });
  let stopped = false;
  let pass: Promise<unknown> = Promise.resolve();
  let timer: NodeJS.Timeout | undefined;
  const schedule = () => {
    if (stopped) return;
    timer = setTimeout(() => {
      pass = resumeAbandoned(options)
        .catch((error) => options.onError?.(error))
        .finally(schedule);
    }, timerMs(intervalMs));
    timer.unref();
  };
  schedule();
  return {
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await pass;
    },
  };
}
