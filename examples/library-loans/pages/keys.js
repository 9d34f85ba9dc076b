// The key-store inspector: pages through GET /admin/keys and deletes one key with DELETE.
import { cell, say } from './dom.js';

const TOKEN = 'loan-desk:admin-token';

const filter = document.getElementById('filter');
const refresh = document.getElementById('refresh');
const tokenForm = document.getElementById('token-form');
const tokenInput = document.getElementById('token');
const body = document.querySelector('#keys tbody');
const more = document.getElementById('more');
// Each cell's column name, which a narrow screen shows beside its value (desk.css).
const columns = [...document.querySelectorAll('#keys thead th')].map((th) => th.textContent);

let records = [];
let next = null;
// The desk's clock minus ours, so "expires in" and "lease left" do not depend on this machine's.
let skewMs = 0;

function admin(path, init = {}) {
  const token = sessionStorage.getItem(TOKEN);
  return fetch(path, { ...init, headers: token ? { authorization: `Bearer ${token}` } : {} });
}

const recordPath = (record) =>
  `/admin/keys/${encodeURIComponent(record.scope)}/${encodeURIComponent(record.key)}`;

/** A scope is a digest of the caller's credential; its head is enough to tell callers apart. */
function shortScope(scope) {
  const [kind, rest] = scope.includes(':')
    ? [scope.slice(0, scope.indexOf(':') + 1), scope.slice(scope.indexOf(':') + 1)]
    : ['', scope];
  return rest.length > 12 ? `${kind}${rest.slice(0, 10)}…` : scope;
}

function duration(ms) {
  if (ms <= 0) return 'passed';
  const seconds = Math.round(ms / 1000);
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${seconds % 60} s`;
  const hours = Math.floor(minutes / 60);
  return hours < 48 ? `${hours} h ${minutes % 60} min` : `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

function render() {
  const nowMs = Date.now() + skewMs;
  const wanted = filter.value.trim().toLowerCase();
  const shown = records.filter((record) => record.key.toLowerCase().includes(wanted));
  body.replaceChildren(
    ...shown.map((record) => {
      const tr = document.createElement('tr');
      tr.dataset.key = record.key;
      const remove = document.createElement('button');
      remove.type = 'button';
      remove.className = 'danger';
      remove.textContent = 'Delete';
      remove.setAttribute('aria-label', `Delete key ${record.key}`);
      remove.addEventListener('click', () => removeKey(record));
      const actions = document.createElement('td');
      actions.append(remove);
      tr.append(
        cell(record.key, { className: 'mono' }),
        cell(shortScope(record.scope), { className: 'mono', title: record.scope }),
        cell(record.state === 'completed' ? 'completed' : 'in progress'),
        cell(record.status === null ? '—' : String(record.status)),
        cell(record.steps?.length ? record.steps.join(' → ') : '—'),
        cell(new Date(record.createdAtMs).toLocaleString()),
        cell(duration(record.expiresAtMs - nowMs)),
        cell(record.leaseUntilMs === null ? '—' : duration(record.leaseUntilMs - nowMs)),
        actions,
      );
      tr.querySelectorAll('td').forEach((td, i) => {
        td.dataset.label = columns[i];
      });
      return tr;
    }),
  );
  more.hidden = next === null;
  const counted = `${records.length} key${records.length === 1 ? '' : 's'}${next === null ? '' : ' so far'}`;
  say(wanted ? `${shown.length} of ${counted} match “${filter.value.trim()}”.` : `${counted}.`);
}

async function load({ reset }) {
  const query = new URLSearchParams({ limit: '100' });
  if (!reset && next) query.set('after', next);
  const response = await admin(`/admin/keys?${query}`);
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401) {
    tokenForm.hidden = false;
    say(answer.message ?? 'The admin API wants a token.', 'error');
    return;
  }
  if (!response.ok) {
    say(answer.message ?? `The desk answered ${response.status}.`, 'error');
    return;
  }
  skewMs = answer.nowMs - Date.now();
  records = reset ? answer.records : [...records, ...answer.records];
  next = answer.next;
  render();
}

async function removeKey(record) {
  const sure = window.confirm(
    `Delete key ${record.key}? A retry that still carries it will then run as a new request.`,
  );
  if (!sure) return;
  const response = await admin(recordPath(record), { method: 'DELETE' });
  if (response.status !== 204 && response.status !== 404) {
    const answer = await response.json().catch(() => ({}));
    say(answer.message ?? `The desk answered ${response.status}; the key was not deleted.`, 'error');
    return;
  }
  const index = records.indexOf(record);
  records = records.filter((other) => other !== record);
  render();
  say(`Key ${record.key} deleted.`);
  // Keep keyboard users where they were: on the next row's Delete button, else on the filter.
  const buttons = body.querySelectorAll('button');
  (buttons[Math.min(index, buttons.length - 1)] ?? filter).focus();
}

filter.addEventListener('input', render);
refresh.addEventListener('click', () => load({ reset: true }));
more.addEventListener('click', () => load({ reset: false }));
tokenForm.addEventListener('submit', (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN, tokenInput.value);
  tokenForm.hidden = true;
  load({ reset: true });
});

load({ reset: true }).catch((error) => say(`The desk cannot be reached (${error.message}).`, 'error'));
