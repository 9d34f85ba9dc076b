import { createHash, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';
import { ConfigError } from 'retrysafe';
import { sendLiveJson as send } from './respond.js';

const LOOPBACK_NAMES = new Set(['localhost', '127.0.0.1', '[::1]']);

const digest = (text) => createHash('sha256').update(text).digest();

function isLoopbackAddress(address = '') {
  const plain = address.startsWith('::ffff:') ? address.slice(7) : address;
  return plain === '::1' || (isIP(plain) === 4 && plain.startsWith('127.'));
}

/**
 * Who may use the admin API. With `adminToken` set, every caller must send
 * `Authorization: Bearer <token>` (from loopback too: behind a reverse proxy every caller comes
 * from loopback). Without it only loopback callers may, and only with a loopback `Host`, so a web
 * page whose DNS name was rebound to 127.0.0.1 cannot read or delete keys through a browser.
 */
export function adminAccess(req, adminToken) {
  if (adminToken) {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
    // Equal-length digests: the comparison takes the same time whatever the token sent.
    if (match && timingSafeEqual(digest(match[1]), digest(adminToken))) return { allowed: true };
    return { allowed: false, message: 'Send the desk’s ADMIN_TOKEN as "Authorization: Bearer <token>".' };
  }
  let host;
  try {
    host = new URL(`http://${req.headers.host ?? ''}`).hostname;
  } catch {
    host = '';
  }
  if (isLoopbackAddress(req.socket.remoteAddress) && LOOPBACK_NAMES.has(host)) return { allowed: true };
  return {
    allowed: false,
    message:
      'The admin API answers only on loopback (127.0.0.1, localhost) unless the desk runs with ADMIN_TOKEN.',
  };
}

/**
 * The desk's JSON admin API over the key store's admin methods (`list`, `get`, `delete`):
 *   GET    /admin/keys?after=&limit=&scope=   one page: {nowMs, records, next}
 *   GET    /admin/keys/:scope/:key            one record, or 404 key_not_found
 *   DELETE /admin/keys/:scope/:key            204, or 404 key_not_found
 * `nowMs` is the desk's clock, so a page computes "expires in" without trusting the browser's.
 * Its handler takes the request's parsed URL and answers `false` for paths it does not serve.
 */
export function adminRoutes({ store, adminToken }) {
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
    const access = adminAccess(req, adminToken);
    if (!access.allowed) {
      send(
        res,
        401,
        { error: 'unauthorized', message: access.message },
        { 'www-authenticate': 'Bearer realm="loan desk admin"' },
      );
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
        const record = await store.get(scope, key);
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
