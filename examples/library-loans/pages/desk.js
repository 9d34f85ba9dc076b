// The "Issue loan" page. One press is one intent: its key is minted and stored with the loan in
// localStorage before anything is sent, every retry carries that key, and the intent leaves
// storage only once the desk has answered it, so neither a lost answer nor a reload lends twice.
import { createRetryingFetch, isRetryBudgetExceededError } from 'retrysafe/client';
import { cell, say } from './dom.js';

const PENDING = 'loan-desk:pending-intent';
/** Marks an attempt whose answer the desk should lose (honoured only with DEMO_FAULTS=1). */
const LOSE_RESPONSE_HEADER = 'x-demo-lose-response';

const form = document.getElementById('loan-form');
const memberSelect = document.getElementById('member');
const bookSelect = document.getElementById('book');
const dateInput = document.getElementById('issued-at');
const button = document.getElementById('issue');
const attempts = document.getElementById('attempts');
const lossy = document.getElementById('lossy');
const loansBody = document.querySelector('#loans tbody');

const members = new Map();
const books = new Map();
let sending = false;

function today() {
  const now = new Date();
  const pad = (n) => String(n).padStart(2, '0');
  return `${now.getFullYear()}-${pad(now.getMonth() + 1)}-${pad(now.getDate())}`;
}

async function getJson(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path} answered ${response.status}`);
  return response.json();
}

function readPending() {
  try {
    return JSON.parse(localStorage.getItem(PENDING) ?? 'null');
  } catch {
    return null;
  }
}

/** While an unanswered intent waits for another press, the form shows it and cannot change it. */
function lockTo(intent) {
  for (const control of [memberSelect, bookSelect, dateInput]) control.disabled = intent !== null;
  if (!intent) return;
  memberSelect.value = intent.body.member;
  bookSelect.value = intent.body.isbn;
  dateInput.value = intent.body.issuedAt;
}

async function refreshLoans() {
  const loans = await getJson('/loans');
  loansBody.replaceChildren(
    ...loans.reverse().map((loan) => {
      const tr = document.createElement('tr');
      tr.dataset.loanId = loan.id;
      tr.append(
        cell(`#${loan.id}`),
        cell(members.get(loan.member)?.name ?? loan.member),
        cell(books.get(loan.isbn)?.title ?? loan.isbn),
        cell(loan.issuedAt),
      );
      return tr;
    }),
  );
}

function logAttempt({ attempt, outcome, delayMs }, replayed) {
  const what =
    outcome.kind === 'error' ? 'network error' : `${outcome.status}${replayed ? ', replayed' : ''}`;
  const li = document.createElement('li');
  li.textContent = `attempt ${attempt}: ${what}${delayMs === null ? '' : ' — retrying with the same key'}`;
  attempts.append(li);
}

/** What a librarian reads once the desk has answered. */
function answerText(status, body, replayed) {
  if (status === 201) {
    const title = books.get(body.isbn)?.title ?? body.isbn;
    const name = members.get(body.member)?.name ?? body.member;
    const lost = replayed
      ? ' An earlier answer was lost on the way; the desk replayed it, so the book was lent once.'
      : '';
    return [`Loan #${body.id} issued: “${title}” to ${name} on ${body.issuedAt}.${lost}`, 'done'];
  }
  if (status === 409 && body.error === 'key_conflict') {
    return [
      'This loan’s key was already used for a different loan, so nothing was lent. Press Issue loan to start again.',
      'error',
    ];
  }
  if (status === 422 && body.field === 'isbn')
    return ['That book is not in the catalogue; nothing was lent.', 'error'];
  if (status === 422 && body.field === 'member')
    return ['That member is not registered; nothing was lent.', 'error'];
  if (status === 400)
    return [`The desk could not read the form (${body.message ?? body.error}); nothing was lent.`, 'error'];
  return [
    `The desk answered ${status}${body.message ? `: ${body.message}` : ''}; nothing was lent.`,
    'error',
  ];
}

/** What a librarian reads when the desk never answered for good: the intent stays pending. */
function unansweredText(error) {
  const again =
    'Press Issue loan to send the same loan again: it carries the same key, so it cannot be lent twice.';
  const last = isRetryBudgetExceededError(error) ? error.lastResponse?.status : undefined;
  if (last === 503) return `The desk’s database is not answering. ${again}`;
  if (last === 409) return `The desk is still working on this loan. ${again}`;
  return `The desk could not be reached. ${again}`;
}

async function send(intent, opening = 'Issuing the loan…') {
  sending = true;
  button.disabled = true;
  attempts.replaceChildren();
  say(opening);
  const replayed = new Map();
  const markFirst = lossy.checked;
  let attempt = 0;
  // A person is watching: a few quick attempts, then the page says so and keeps the loan pending
  // (the library's defaults, made to outlast a server restart, would keep them waiting a minute).
  const retryingFetch = createRetryingFetch({
    deadlineMs: 20_000,
    maxAttempts: 5,
    baseDelayMs: 100,
    // The same fetch the page would use, seeing each attempt's answer for the attempt log.
    fetch: async (request, init) => {
      attempt++;
      const current = attempt;
      if (markFirst && current === 1) request.headers.set(LOSE_RESPONSE_HEADER, '1');
      const response = await fetch(request, init);
      replayed.set(current, response.headers.get('idempotency-replayed') === 'true');
      return response;
    },
    onAttempt: (event) => logAttempt(event, replayed.get(event.attempt)),
  });
  try {
    const response = await retryingFetch('/loans', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(intent.body),
      idempotencyKey: intent.key,
    });
    const body = await response.json().catch(() => ({}));
    localStorage.removeItem(PENDING);
    lockTo(null);
    say(...answerText(response.status, body, response.headers.get('idempotency-replayed') === 'true'));
  } catch (error) {
    lockTo(intent);
    say(unansweredText(error), 'error');
  } finally {
    sending = false;
    button.disabled = false;
    if (document.activeElement === document.body) button.focus();
    await refreshLoans().catch(() => {});
  }
}

form.addEventListener('submit', (event) => {
  event.preventDefault();
  if (sending) return;
  let intent = readPending();
  if (!intent) {
    intent = {
      key: crypto.randomUUID(),
      body: { member: memberSelect.value, isbn: bookSelect.value, issuedAt: dateInput.value },
    };
    // Stored before the first byte leaves: from here on a reload resends this key.
    localStorage.setItem(PENDING, JSON.stringify(intent));
  }
  send(intent);
});

async function start() {
  const [memberList, bookList, demo] = await Promise.all([
    getJson('/members'),
    getJson('/books'),
    getJson('/demo'),
  ]);
  for (const member of memberList) {
    members.set(member.id, member);
    memberSelect.append(new Option(`${member.name} (${member.id})`, member.id));
  }
  for (const book of bookList) {
    books.set(book.isbn, book);
    bookSelect.append(new Option(`${book.title} — ${book.author}`, book.isbn));
  }
  dateInput.value = today();
  lossy.disabled = !demo.demoFaults;
  if (!demo.demoFaults) {
    document.getElementById('lossy-help').append(' It works only when the desk runs with DEMO_FAULTS=1.');
  }
  await refreshLoans();
  button.disabled = false;
  const pending = readPending();
  if (pending) {
    lockTo(pending);
    await send(pending, 'Resuming the loan that was being issued when the page closed, with its same key…');
  } else {
    say('Ready.');
  }
}

start().catch((error) =>
  say(`The desk cannot be reached (${error.message}). Reload the page to try again.`, 'error'),
);
