import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { type Attempt, check, type Effect, type History } from '../scripts/torture/checker.js';

/**
 * The torture checker against hand-made histories: a good one passes, and each rule fires on a
 * history that breaks it (and only that rule), so a clean torture table means something.
 */

const BODY = '{"item":"c0:k1","holdMs":0}';
const ANSWER = '{"id":"1","item":"c0:k1"}';

function attempt(fields: Partial<Attempt> = {}): Attempt {
  return {
    client: 'c0',
    scope: 'Bearer c0',
    key: 'k1',
    body: BODY,
    startMs: 1000,
    endMs: 1010,
    status: 201,
    answer: ANSWER,
    retryAfter: null,
    replayed: false,
    app: 'app0',
    phase: 'load',
    ...fields,
  };
}

const effect = (fields: Partial<Effect> = {}): Effect => ({
  scope: 'Bearer c0',
  key: 'k1',
  item: 'c0:k1',
  id: '1',
  runs: 1,
  ...fields,
});

/** One key answered 201, its one effect, and the final pass's replay. */
function good(mode = 'atomic'): History {
  return {
    store: 'hand-made',
    mode,
    attempts: [
      attempt({ status: 0, answer: 'ECONNRESET' }),
      attempt({ startMs: 1100, status: 503, answer: '{"error":"store_unavailable"}', retryAfter: '1' }),
      attempt({ startMs: 1200, status: 409, answer: '{"error":"request_in_progress"}', retryAfter: '1' }),
      attempt({ startMs: 1300 }),
      attempt({ startMs: 1400, replayed: true }),
      attempt({
        startMs: 1500,
        body: '{"item":"c0:k1:other","holdMs":0}',
        status: 409,
        answer: '{"error":"key_conflict"}',
      }),
      attempt({ startMs: 9000, phase: 'replay', client: 'replay', replayed: true }),
    ],
    effects: [effect()],
    faults: {},
  };
}

const rulesOf = (history: History) => [...new Set(check(history).anomalies.map((anomaly) => anomaly.rule))];

describe('torture checker', () => {
  it('passes a history that keeps every promise', () => {
    expect(check(good())).toMatchObject({ anomalies: [], keys: 1, acknowledged: 1, reExecutions: 0 });
  });

  it('one-effect: two effects for one (scope, key)', () => {
    const history = good();
    history.effects.push(effect({ id: '2' }));
    expect(rulesOf(history)).toEqual(['one-effect']);
  });

  it('the same key in two scopes is two operations', () => {
    const history = good();
    history.attempts.push(attempt({ scope: 'Bearer c1', client: 'c1', status: 0, answer: 'ECONNREFUSED' }));
    history.effects.push(effect({ scope: 'Bearer c1', id: '2' }));
    expect(check(history)).toMatchObject({ anomalies: [], keys: 2, acknowledged: 1 });
  });

  it('acknowledged-effect: a 2xx with no effect', () => {
    const history = good();
    history.effects = [];
    expect(rulesOf(history)).toEqual(['acknowledged-effect']);
  });

  it('same-answer: two 2xx bodies for one key', () => {
    const history = good();
    history.attempts.push(attempt({ startMs: 1450, answer: '{"id":"2","item":"c0:k1"}' }));
    expect(rulesOf(history)).toEqual(['same-answer']);
  });

  it('mismatch-executed: another body answered 2xx, or its effect landed', () => {
    const answered = good();
    answered.attempts.push(attempt({ startMs: 1600, body: '{"item":"c0:k1:other","holdMs":0}' }));
    expect(rulesOf(answered)).toEqual(['mismatch-executed']);
    const landed = good();
    landed.effects = [effect({ item: 'c0:k1:other' })];
    expect(rulesOf(landed)).toEqual(['mismatch-executed']);
  });

  it('answer-outside-contract: a 500, a 503 or in-progress 409 without Retry-After, a key_conflict for its own body', () => {
    for (const wrong of [
      attempt({ startMs: 1050, status: 500, answer: '{"error":"internal"}' }),
      attempt({ startMs: 1050, status: 503, answer: '{"error":"store_unavailable"}' }),
      attempt({ startMs: 1050, status: 409, answer: '{"error":"request_in_progress"}' }),
      attempt({ startMs: 1050, status: 409, answer: '{"error":"key_conflict"}' }),
      attempt({ startMs: 1050, status: 404, answer: '{"error":"path_not_found"}' }),
    ]) {
      const history = good();
      history.attempts.push(wrong);
      expect(rulesOf(history)).toEqual(['answer-outside-contract']);
    }
  });

  it('replay-after-restarts: no replay, another answer, or (atomic mode) the answer made again', () => {
    const none = good();
    none.attempts = none.attempts.filter((a) => a.phase !== 'replay');
    expect(rulesOf(none)).toEqual(['replay-after-restarts']);
    const other = good();
    other.attempts.push(attempt({ startMs: 9100, phase: 'replay', status: 0, answer: 'ECONNREFUSED' }));
    other.attempts = other.attempts.filter((a) => !(a.phase === 'replay' && a.status === 201));
    expect(rulesOf(other)).toEqual(['replay-after-restarts']);
    const again = good('atomic');
    again.attempts = again.attempts.map((a) => (a.phase === 'replay' ? { ...a, replayed: false } : a));
    expect(rulesOf(again)).toEqual(['replay-after-restarts']);
  });

  it('lease mode: a key answered alike by running it again is counted, not an anomaly (a failed save, docs/guarantees.md)', () => {
    const history = good('lease');
    history.attempts = history.attempts.map((a) => (a.phase === 'replay' ? { ...a, replayed: false } : a));
    history.effects = [effect({ runs: 2 })];
    expect(check(history)).toMatchObject({ anomalies: [], reExecutions: 1, answeredAgain: 1 });
  });

  it('a recorded MariaDB lease-mode history: the save failed under faults, the 201 was sent, the final pass ran it again', () => {
    const recorded: History = JSON.parse(
      readFileSync(new URL('fixtures/torture/mysql-lease-failed-save.json', import.meta.url), 'utf8'),
    );
    expect(check(recorded)).toMatchObject({
      anomalies: [],
      acknowledged: 1,
      reExecutions: 1,
      answeredAgain: 1,
    });
    expect(rulesOf({ ...recorded, mode: 'atomic' })).toEqual(['replay-after-restarts']);
  });
});
