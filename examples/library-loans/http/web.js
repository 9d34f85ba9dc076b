import { readdirSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { sendLiveJson } from './respond.js';

const PAGES_DIR = fileURLToPath(new URL('../pages/', import.meta.url));
// The package build the desk itself runs on: the page loads `retrysafe/client` from it, the same
// module a Node caller imports.
const DIST_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.resolve('retrysafe/client'))), '..');
const TYPES = { '.html': 'text/html', '.css': 'text/css', '.js': 'text/javascript' };
const MODULE_PATH = /^[\w-]+(\/[\w-]+)*\.js$/;

// Read once: the pages are a handful of small files, and a fixed set leaves no path to traverse.
const files = new Map(
  readdirSync(PAGES_DIR).map((name) => [
    name,
    {
      type: `${TYPES[path.extname(name)] ?? 'application/octet-stream'}; charset=utf-8`,
      body: readFileSync(path.join(PAGES_DIR, name)),
    },
  ]),
);
const ROUTES = new Map([
  ['/', 'desk.html'],
  ['/keys', 'keys.html'],
]);

function sendFile(res, file, method) {
  res.writeHead(200, {
    'content-type': file.type,
    'content-length': file.body.length,
    'cache-control': 'no-cache',
  });
  res.end(method === 'HEAD' ? undefined : file.body);
}

/**
 * The desk's pages: `/` (the "Issue loan" page), `/keys` (the key-store inspector), their assets
 * under `/pages/`, the retrysafe modules they import under `/retrysafe/`, and `/demo` telling the
 * page whether the lossy-network switch works. Its handler takes the request's parsed URL and
 * answers `false` for paths it does not serve.
 */
export function webRoutes({ demoFaults }) {
  return function webHandler(req, res, { pathname }) {
    if (req.method !== 'GET' && req.method !== 'HEAD') return false;
    const page = ROUTES.get(pathname) ?? (pathname.startsWith('/pages/') && pathname.slice('/pages/'.length));
    const file = page && files.get(page);
    if (file) {
      sendFile(res, file, req.method);
      return true;
    }
    if (pathname === '/demo') {
      sendLiveJson(res, 200, { demoFaults });
      return true;
    }
    const modulePath = pathname.startsWith('/retrysafe/') && pathname.slice('/retrysafe/'.length);
    if (modulePath && MODULE_PATH.test(modulePath)) {
      readFile(path.join(DIST_DIR, modulePath)).then(
        (body) => sendFile(res, { type: 'text/javascript; charset=utf-8', body }, req.method),
        () => sendLiveJson(res, 404, { error: 'path_not_found' }),
      );
      return true;
    }
    return false;
  };
}
