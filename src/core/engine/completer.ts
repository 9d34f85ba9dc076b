import { type AbandonedRecord, type IdempotencyStore, RetrysafeError } from '../contract/index.js';
import { type Duration, timerMs, toMs, unrefTimer } from '../options/index.js';
import { untilAborted } from './deadline.js';

/** Options of {@link resumeAbandoned} and {@link startCompleter}. */
export interface CompleterOptions {
  /** The store the guarded handlers save to. */
  store: IdempotencyStore;
  /**
   * Re-drives one abandoned record through the application: an HTTP adapter's
   * `idem.resumeThrough(app)` (its middleware, the guard and the route's handler run as for the
   * client's request), or in a binding of your own `engine.resume(record, run)` (the engine of
   * `createIdempotency`, `retrysafe/adapter`). It claims the record with the normal fencing, so of
   * many processes resuming one record, one runs it.
   */
  resume: (record: AbandonedRecord, signal: AbortSignal) => Promise<unknown>;
  /**
   * How long one resume may run. Past it (or at `stop()`) `signal` aborts: `resumeThrough(app)`
   * and `engine.resume` then stop renewing the operation's lease and end it, so a later pass (or the
   * client's retry) takes it over, and the completer goes on with the next record. A `resume`
   * that ignores `signal` is no longer waited for, but keeps its lease while it runs.
   * @default '30s'
   */
  resumeTimeout?: Duration;
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
 * await resumeAbandoned({ store, resume: idem.resumeThrough(app) });
 */
export async function resumeAbandoned(options: CompleterOptions, stopping?: AbortSignal): Promise<number> {
  const timeoutMs = toMs('resumeTimeout', options.resumeTimeout ?? '30s', { min: 1 });
  const records = await options.store.abandoned({ limit: options.batchSize ?? 100 });
  let handed = 0;
  for (const record of records) {
    if (stopping?.aborted) break;
    handed++;
    try {
      await resumeWithin(options, record, timeoutMs, stopping);
    } catch (error) {
      if (!stopping?.aborted) options.onError?.(error);
    }
  }
  return handed;
}

/** One resume, no longer waited for than `timeoutMs` or than until `stopping` aborts. */
async function resumeWithin(
  options: CompleterOptions,
  record: AbandonedRecord,
  timeoutMs: number,
  stopping: AbortSignal | undefined,
): Promise<unknown> {
  const controller = new AbortController();
  const timer = setTimeout(
    () =>
      controller.abort(
        new RetrysafeError(
          `retrysafe: the completer's resume of key ${record.key} did not settle within ${timeoutMs} ms (resumeTimeout); its lease is ended`,
        ),
      ),
    timerMs(timeoutMs),
  );
  unrefTimer(timer);
  const stop = () => controller.abort(stopping?.reason);
  stopping?.addEventListener('abort', stop, { once: true });
  try {
    return await Promise.race([options.resume(record, controller.signal), untilAborted(controller.signal)]);
  } finally {
    clearTimeout(timer);
    stopping?.removeEventListener('abort', stop);
  }
}

/**
 * Runs {@link resumeAbandoned} every `interval` (an unref'd timer; passes never overlap) until
 * `stop()`, which aborts the resume under way (its `signal`) and resolves once the pass has ended:
 * within the store's `abandoned` call at most, never after a hung resume.
 * @example
 * const idem = idempotency({ store, route: 'POST /fines' }); // retrysafe/express
 * app.post('/fines', express.json(), idem, chargeFine);
 * const completer = startCompleter({ store, resume: idem.resumeThrough(app), interval: '2s' });
 * process.on('SIGTERM', () => completer.stop());
 */
export function startCompleter(options: StartCompleterOptions): { stop(): Promise<void> } {
  const intervalMs = toMs('interval', options.interval ?? '5s', { min: 1 });
  toMs('resumeTimeout', options.resumeTimeout ?? '30s', { min: 1 });
  const stopping = new AbortController();
  let pass: Promise<unknown> = Promise.resolve();
  let timer: NodeJS.Timeout | undefined;
  const schedule = () => {
    if (stopping.signal.aborted) return;
    timer = setTimeout(() => {
      pass = resumeAbandoned(options, stopping.signal)
        .catch((error) => options.onError?.(error))
        .finally(schedule);
    }, timerMs(intervalMs));
    unrefTimer(timer);
  };
  schedule();
  return {
    async stop() {
      stopping.abort(new RetrysafeError('retrysafe: the completer was stopped'));
      clearTimeout(timer);
      await pass;
    },
  };
}
