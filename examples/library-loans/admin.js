import { createHash, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';
import { ConfigError, storedResponseView } from 'retrysafe';
import { sendLiveJson as send } from './http/respond.js';

const LOOPBACK_NAMES = new Set(['localhost', '127.0.0.1', '[::1]']);

const digest = (text) => createHash('sha256').update(text).digest();

function isLoopbackAddress(address = '') {
  const plain = address.startsWith('::ffff:') ? address.slice(7) : address;
  return plain === '::1' || (isIP(plain) === 4 && plain.startsWith('127.'));
}

// A proxy on the same host connects from loopback for every caller; these mark its requests.
const FORWARDING_HEADERS = ['x-forwarded-for', 'forwarded', 'via'];

/** Whether the request carries `Authorization: Bearer <adminToken>`, compared in constant time. */
export function hasAdminToken(req, adminToken) {
  const match = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
  // Equal-length digests: the comparison takes the same time whatever the token sent.
  return Boolean(match) && timingSafeEqual(digest(match[1]), digest(adminToken));
}

function isTrustedLoopback(req) {
  if (FORWARDING_HEADERS.some((name) => req.headers[name] !== undefined)) return false;
  let host;
  try {
    host = new URL(`http://${req.headers.host ?? ''}`).hostname;
  } catch {
    host = '';
  }
  return isLoopbackAddress(req.socket.remoteAddress) && LOOPBACK_NAMES.has(host);
}

/**
 * Who may use the admin API: closed unless the desk runs with `adminToken` (every caller sends
 * `Authorization: Bearer <token>`) or `adminLoopback` (callers on loopback naming a loopback
 * `Host`, so a page whose DNS name was rebound to 127.0.0.1 cannot use it through a browser).
 * A request carrying a forwarding header is never loopback: a reverse proxy on this host
 * connects from 127.0.0.1 for anyone.
 */
export function adminAccess(req, { adminToken, adminLoopback }) {
  if (adminToken && hasAdminToken(req, adminToken)) return { allowed: true };
  if (adminLoopback && isTrustedLoopback(req)) return { allowed: true };
  if (adminToken) {
    return { allowed: false, message: 'Send the desk’s ADMIN_TOKEN as "Authorization: Bearer <token>".' };
  }
  return {
    allowed: false,
    message: adminLoopback
      ? 'The admin API answers only direct loopback callers (127.0.0.1, localhost, no proxy) unless the desk runs with ADMIN_TOKEN.'
      : 'The admin API is closed: start the desk with ADMIN_TOKEN=<secret> (then send it as a Bearer token), or ADMIN_LOOPBACK=1 to trust direct loopback callers.',
  };
}

/** Answers 401 with the reason, as JSON. */
export function sendUnauthorized(res, message) {
  send(
    res,
    401,
    { error: 'unauthorized', message },
    { 'www-authenticate': 'Bearer realm="loan desk admin"' },
  );
}

/** One line for the start log: where the key store page is and how to open it. */
export function describeAdminAccess({ adminToken, adminLoopback }, url) {
  if (adminToken) return `key store: ${url}/keys (enter ADMIN_TOKEN on the page)`;
  if (adminLoopback) return `key store: ${url}/keys (ADMIN_LOOPBACK=1: direct loopback callers only)`;
  return `key store: ${url}/keys is closed; start with ADMIN_TOKEN=<secret> or, with no proxy in front, ADMIN_LOOPBACK=1`;
}

/**
 * The desk's JSON admin API over the key store's admin methods (`list`, `get`, `delete`):
 *   GET    /admin/keys?after=&limit=&scope=   one page: {nowMs, records, next}
 *   GET    /admin/keys/:scope/:key            one record, or 404 key_not_found; with ?response=1
 *                                             a completed one carries its saved answer `response`
 *                                             ({status, headers, body | bodyBase64}), decrypted with
 *                                             the desk's IDEMPOTENCY_ENCRYPTION_KEY
 *   DELETE /admin/keys/:scope/:key            204, or 404 key_not_found
 * `nowMs` is the desk's clock, so a page computes "expires in" without trusting the browser's.
 * Its handler takes the request's parsed URL and answers `false` for paths it does not serve.
 */
export function adminRoutes({ store, adminToken, adminLoopback, encryptionKeys }) {
  async function answer(res, work) {
    try {
      await work();
    } catch (error) {
      if (error instanceof ConfigError) {
        return send(res, 400, { error: 'invalid_query', message: error.message });
      }
      console.error('loan desk: key store admin call failed:', error.message);
      send(
        res,
        503,
        { error: 'store_unavailable', message: 'The key store did not answer; try again.' },
        { 'retry-after': '1' },
      );
    }
  }

  return function adminHandler(req, res, { pathname, searchParams: query }) {
    if (pathname !== '/admin/keys' && !pathname.startsWith('/admin/keys/')) return false;
    const access = adminAccess(req, { adminToken, adminLoopback });
    if (!access.allowed) {
      sendUnauthorized(res, access.message);
      return true;
    }
    if (pathname === '/admin/keys') {
      if (req.method !== 'GET') {
        send(res, 405, { error: 'method_not_allowed', allow: 'GET' }, { allow: 'GET' });
        return true;
      }
      const limit = query.get('limit');
      answer(res, async () => {
        const page = await store.list({
          after: query.get('after') || undefined,
          limit: limit ? Number(limit) : undefined,
          scope: query.get('scope') || undefined,
        });
        send(res, 200, { nowMs: Date.now(), ...page });
      });
      return true;
    }
    const parts = pathname.slice('/admin/keys/'.length).split('/');
    let scope;
    let key;
    try {
      [scope, key] = parts.length === 2 ? parts.map(decodeURIComponent) : [];
    } catch {
      // A malformed %-escape names no key.
    }
    if (!scope || !key) {
      send(res, 404, { error: 'path_not_found' });
      return true;
    }
    if (req.method === 'GET') {
      answer(res, async () => {
        const found = await store.get(scope, key, { response: query.get('response') === '1' });
        const record = found?.response
          ? { ...found, response: storedResponseView(found.response, { encryptionKey: encryptionKeys }) }
          : found;
        if (record) send(res, 200, { nowMs: Date.now(), record });
        else send(res, 404, { error: 'key_not_found' });
      });
    } else if (req.method === 'DELETE') {
      answer(res, async () => {
        if (await store.delete(scope, key)) send(res, 204);
        else send(res, 404, { error: 'key_not_found' });
      });
    } else {
      send(res, 405, { error: 'method_not_allowed', allow: 'GET, DELETE' }, { allow: 'GET, DELETE' });
    }
    return true;
  };
}
