// @ts-check

/**
 * The torture run's checker: reads a recorded history (every attempt a client made, every effect
 * row in the database at the end) and names each broken promise. Pure: the same history always
 * gives the same verdict, so a failing history kept as JSON is replayed with `run.js --check FILE`.
 *
 * @typedef {object} Attempt
 * @property {string} client the client that sent it
 * @property {string} scope the scope the app saw (the client's credential)
 * @property {string} key the Idempotency-Key
 * @property {string} body the request body sent
 * @property {number} startMs
 * @property {number} endMs
 * @property {number} status the answer's status; 0 when none came (refused, reset, timed out)
 * @property {string} answer the answer's body, or the error when none came
 * @property {string | null} retryAfter the answer's Retry-After header
 * @property {boolean} replayed the answer carried `Idempotency-Replayed: true`
 * @property {string} app the app process the attempt went to
 * @property {'load' | 'replay'} phase `replay`: the final pass after every fault and restart
 *
 * @typedef {object} Effect
 * @property {string} scope
 * @property {string} key
 * @property {string} item the order's item: what the body asked for
 * @property {string} id
 * @property {number} runs how many handler runs wrote it (lease mode's keyed effect: > 1 is a re-execution)
 *
 * @typedef {object} History
 * @property {string} store
 * @property {string} mode
 * @property {Attempt[]} attempts
 * @property {Effect[]} effects
 * @property {Record<string, number>} faults injected faults by kind
 *
 * @typedef {'one-effect' | 'acknowledged-effect' | 'same-answer' | 'mismatch-executed'
 *   | 'answer-outside-contract' | 'replay-after-restarts'} Rule
 *
 * @typedef {object} Anomaly
 * @property {Rule} rule
 * @property {string} scope
 * @property {string} key
 * @property {string} detail
 */

/** The rules, each with what it holds, for reports. */
export const RULES = /** @type {const} */ ({
  'one-effect': 'at most one effect per (scope, key)',
  'acknowledged-effect': 'exactly one effect for every key that got a 2xx',
  'same-answer': 'every 2xx for a key carries the same status and body',
  'mismatch-executed': 'a key reused with another body never executes',
  'answer-outside-contract': 'no answer but 2xx, a 4xx of the contract, 503 with Retry-After',
  'replay-after-restarts':
    'every acknowledged key answers the same after all the faults: replayed (atomic mode) or, in lease mode, replayed or run again to the same answer',
});

/** 4xx answers the contract (docs/reference.md, HTTP outcomes) gives a keyed POST. */
const CONTRACT_4XX = new Set([400, 409, 422]);

const is2xx = (/** @type {number} */ status) => status >= 200 && status < 300;
const idOf = (/** @type {string} */ scope, /** @type {string} */ key) => JSON.stringify([scope, key]);

/** @param {string} text */
function errorCode(text) {
  try {
    return JSON.parse(text)?.error;
  } catch {
    return undefined;
  }
}

/** @param {string} body */
function itemOf(body) {
  try {
    return JSON.parse(body)?.item;
  } catch {
    return undefined;
  }
}

/**
 * @param {History} history
 * @returns {{ anomalies: Anomaly[], keys: number, acknowledged: number, reExecutions: number, answeredAgain: number }}
 *   `reExecutions`: extra handler runs of one effect (lease mode's keyed effect); `answeredAgain`:
 *   acknowledged keys (lease mode) the final pass answered alike, but by running them again
 */
export function check(history) {
  /** @type {Anomaly[]} */
  const anomalies = [];
  /** @type {Map<string, { scope: string, key: string, attempts: Attempt[], effects: Effect[] }>} */
  const operations = new Map();
  const operation = (/** @type {string} */ scope, /** @type {string} */ key) => {
    const id = idOf(scope, key);
    let found = operations.get(id);
    if (!found) {
      found = { scope, key, attempts: [], effects: [] };
      operations.set(id, found);
    }
    return found;
  };
  for (const attempt of history.attempts) operation(attempt.scope, attempt.key).attempts.push(attempt);
  for (const effect of history.effects) operation(effect.scope, effect.key).effects.push(effect);

  let acknowledged = 0;
  let reExecutions = 0;
  let answeredAgain = 0;
  for (const { scope, key, attempts, effects } of operations.values()) {
    const flag = (/** @type {Rule} */ rule, /** @type {string} */ detail) =>
      anomalies.push({ rule, scope, key, detail });
    attempts.sort((a, b) => a.startMs - b.startMs);
    // The key's intent is the body it was first sent with; any other body is a reuse of the key.
    const firstBody = attempts[0]?.body;
    const firstItem = firstBody === undefined ? undefined : itemOf(firstBody);
    for (const effect of effects) reExecutions += Math.max(0, effect.runs - 1);

    if (effects.length > 1)
      flag('one-effect', `${effects.length} effects: ids ${effects.map((e) => e.id).join(', ')}`);
    for (const effect of effects) {
      if (firstItem !== undefined && effect.item !== firstItem) {
        flag(
          'mismatch-executed',
          `effect ${effect.id} wrote item ${effect.item}, the key was made for ${firstItem}`,
        );
      }
    }

    const loadAnswers = attempts.filter((a) => a.phase === 'load' && is2xx(a.status) && a.body === firstBody);
    for (const attempt of attempts) {
      const where = `${attempt.phase} attempt of ${attempt.client} at ${attempt.startMs} on ${attempt.app}`;
      const code = errorCode(attempt.answer);
      if (attempt.body !== firstBody && is2xx(attempt.status)) {
        flag('mismatch-executed', `${where}: another body answered ${attempt.status} ${attempt.answer}`);
      }
      if (attempt.status === 0 || is2xx(attempt.status)) continue;
      if (attempt.status === 503) {
        if (attempt.retryAfter === null) flag('answer-outside-contract', `${where}: 503 without Retry-After`);
      } else if (!CONTRACT_4XX.has(attempt.status)) {
        flag('answer-outside-contract', `${where}: ${attempt.status} ${attempt.answer}`);
      } else if (code === 'request_in_progress' && attempt.retryAfter === null) {
        flag('answer-outside-contract', `${where}: 409 request_in_progress without Retry-After`);
      } else if (code === 'key_conflict' && attempt.body === firstBody) {
        flag('answer-outside-contract', `${where}: key_conflict for the key's own body`);
      } else if (code !== 'request_in_progress' && code !== 'key_conflict') {
        flag('answer-outside-contract', `${where}: ${attempt.status} ${attempt.answer}`);
      }
    }

    if (loadAnswers.length === 0) continue;
    acknowledged++;
    if (effects.length === 0)
      flag('acknowledged-effect', `answered ${loadAnswers[0]?.status} but no effect landed`);
    const first = /** @type {Attempt} */ (loadAnswers[0]);
    const answered = [...loadAnswers, ...attempts.filter((a) => a.phase === 'replay' && is2xx(a.status))];
    for (const other of answered) {
      if (other.status !== first.status || other.answer !== first.answer) {
        flag(
          'same-answer',
          `${first.status} ${first.answer} first, ${other.status} ${other.answer} from ${other.app} at ${other.startMs}`,
        );
      }
    }
    const replays = attempts.filter((a) => a.phase === 'replay' && a.body === firstBody);
    const same = replays.filter((a) => a.status === first.status && a.answer === first.answer);
    const got = () =>
      replays.map((a) => `${a.status}${a.replayed ? ' replayed' : ''} ${a.answer}`).join('; ');
    if (same.length === 0) flag('replay-after-restarts', `final pass answered ${got() || 'nothing'}`);
    else if (!same.some((a) => a.replayed)) {
      // The same answer, made again: the key's record was not saved. Lease mode allows this after
      // a failed save (docs/guarantees.md), its keyed effect giving the same answer; atomic mode
      // answers only what it committed, so there it is a lost record.
      if (history.mode === 'atomic') flag('replay-after-restarts', `final pass ran it again: ${got()}`);
      else answeredAgain++;
    }
  }
  return { anomalies, keys: operations.size, acknowledged, reExecutions, answeredAgain };
}
