/** Answers with a JSON body (none for `undefined`), never cached: every answer is live data. */
export function sendJson(res, status, payload, headers = {}) {
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'cache-control': 'no-store',
    ...headers,
  });
  res.end(payload === undefined ? undefined : JSON.stringify(payload));
}
