import { createRetryingFetch, isRetryBudgetExceededError } from 'retrysafe/client';
import { BOOKS, MEMBERS } from '../databases/catalog.js';
import { createFaultProxy } from './fault-proxy.js';

/**
 * The "lossy network" act: many loan intents sent through a proxy that drops responses after the
 * desk processed them and refuses connections, each intent retried by `retrysafe/client` until it
 * gets its answer. With keys every intent ends as exactly one loan; without them every dropped
 * response that is retried becomes a duplicate loan.
 *
 * @typedef {object} LossyActOptions
 * @property {string} baseUrl the loan desk on loopback, e.g. `http://127.0.0.1:8483`
 * @property {number} [intents] default 100
 * @property {number} [concurrency] client tasks sending at once; default 10
 * @property {number} [dropRate] default 0.3
 * @property {number} [refuseRate] default 0.1
 * @property {boolean} [keys] send an `Idempotency-Key` per intent; default true
 * @property {number} [seed] seeds the proxy's faults
 * @property {(line: string) => void} [log] default `console.log`
 *
 * @typedef {{ member: string, isbn: string, issuedAt: string }} LoanIntent
 * @typedef {{ id: number | string, member: string, isbn: string, issuedAt: string }} Loan
 * @typedef {{ intent: LoanIntent, loan?: Loan, status?: number, error?: unknown }} IntentOutcome
 *
 * @typedef {object} LossyActResult
 * @property {number} intents
 * @property {number} attempts HTTP attempts the client made for all intents
 * @property {number} drops responses the proxy dropped after the desk processed the request
 * @property {number} refused connections the proxy refused
 * @property {number} loans loans the desk holds now that it did not hold before the act
 * @property {number} duplicates `loans - intents`: loans no intent asked for
 * @property {number} answered intents whose final answer was a 201 carrying their own loan
 * @property {IntentOutcome[]} outcomes per intent, in intent order
 */

/** @param {string} baseUrl @returns {Promise<Loan[]>} */
async function listLoans(baseUrl) {
  const response = await fetch(new URL('/loans', baseUrl));
  if (!response.ok) throw new Error(`GET /loans answered ${response.status}`);
  const body = await response.json();
  return Array.isArray(body) ? body : body.loans;
}

/** @param {LoanIntent} intent @param {Loan} loan */
function isOwnLoan(intent, loan) {
  return loan.member === intent.member && loan.isbn === intent.isbn && loan.issuedAt === intent.issuedAt;
}

/**
 * @param {LossyActOptions} options
 * @returns {Promise<LossyActResult>}
 * @example
 * await runLossyNetworkAct({ baseUrl: 'http://127.0.0.1:8483', intents: 100 });
 */
export async function runLossyNetworkAct({
  baseUrl,
  intents = 100,
  concurrency = 10,
  dropRate = 0.3,
  refuseRate = 0.1,
  keys = true,
  seed,
  log = console.log,
}) {
  const target = new URL(baseUrl);
  const proxy = createFaultProxy({
    targetHost: target.hostname,
    targetPort: Number(target.port || 80),
    dropRate,
    refuseRate,
    seed,
  });
  const proxyPort = await proxy.start();
  let attempts = 0;
  const retryingFetch = createRetryingFetch({
    // Without keys the client retries just the same, naming each intent in a header the desk does
    // not read: a retrying client facing a server that honours no keys (the client never retries a
    // POST that carries no key at all).
    headerName: keys ? 'Idempotency-Key' : 'X-Request-Id',
    // Short waits keep the act quick; 20 attempts make a 40 % loss rate practically never exhaust it.
    baseDelayMs: 5,
    maxDelayMs: 100,
    maxAttempts: 20,
    deadlineMs: 20_000,
    onAttempt: () => {
      attempts++;
    },
  });

  // Each intent's issuedAt (a day counted back from today) is unique, so a response carrying
  // another intent's loan is detectable.
  const todayMs = Date.parse(new Date().toISOString().slice(0, 10));
  /** @type {LoanIntent[]} */
  const plan = Array.from({ length: intents }, (_, i) => ({
    member: MEMBERS[i % MEMBERS.length].id,
    isbn: BOOKS[i % BOOKS.length].isbn,
    issuedAt: new Date(todayMs - i * 86_400_000).toISOString().slice(0, 10),
  }));
  /** @type {IntentOutcome[]} */
  const outcomes = new Array(intents);

  /** @param {number} index */
  async function send(index) {
    const intent = plan[index];
    try {
      const response = await retryingFetch(`http://127.0.0.1:${proxyPort}/loans`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(intent),
      });
      outcomes[index] = { intent, status: response.status, loan: await response.json() };
    } catch (error) {
      if (!isRetryBudgetExceededError(error)) throw error;
      outcomes[index] = { intent, error };
    }
  }

  const loansBefore = (await listLoans(baseUrl)).length;
  log(
    `Lossy network${keys ? '' : ' (no keys)'}: ${intents} loan intents from ${concurrency} clients through a proxy ` +
      `dropping ${Math.round(dropRate * 100)}% of responses and refusing ${Math.round(refuseRate * 100)}% of connections`,
  );
  let next = 0;
  try {
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next < intents) await send(next++);
      }),
    );
  } finally {
    await proxy.close();
  }
  const loans = (await listLoans(baseUrl)).length - loansBefore;
  const answered = outcomes.filter((o) => o.status === 201 && o.loan && isOwnLoan(o.intent, o.loan)).length;
  const result = {
    intents,
    attempts,
    drops: proxy.stats.dropped,
    refused: proxy.stats.refused,
    loans,
    duplicates: loans - intents,
    answered,
    outcomes,
  };
  log(
    `  ${keys ? 'with' : 'without'} Idempotency-Key: ${attempts} attempts, ${result.drops} responses dropped, ` +
      `${result.refused} connections refused -> ${loans} loans (${result.duplicates} duplicates), ` +
      `${answered}/${intents} intents got their own loan`,
  );
  return result;
}
