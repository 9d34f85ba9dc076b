/** Answers with a JSON body (none for `undefined`). */
export function sendJson(res, status, payload, headers = {}) {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', ...headers });
  res.end(payload === undefined ? undefined : JSON.stringify(payload));
}

/** {@link sendJson}, never cached: the admin API and the pages' answers are live data. */
export const sendLiveJson = (res, status, payload, headers = {}) =>
  sendJson(res, status, payload, { 'cache-control': 'no-store', ...headers });
