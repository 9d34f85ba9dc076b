/** Answers with a JSON body (none for `undefined`). */
export function sendJson(res, status, payload, headers = {}) {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', ...headers });
  res.end(payload === undefined ? undefined : JSON.stringify(payload));
}

/** {@link sendJson}, never cached: the admin API and the pages' answers are live data. */
export const sendLiveJson = (res, status, payload, headers = {}) =>
  sendJson(res, status, payload, { 'cache-control': 'no-store', ...headers });

/** Answers 503 (with `Retry-After`) to a database call that failed while `doing` ("lending"), and logs it. */
export function databaseUnavailable(res, doing, error) {
  console.error(`loan desk: ${doing} failed:`, error.message);
  sendJson(
    res,
    503,
    { error: 'database_unavailable', message: 'The database did not answer; try again.' },
    { 'retry-after': '1' },
  );
}

/** Answers 200 with what `query` found, 404 `{error: notFound}` when nothing, 503 when it failed. */
export async function sendFound(res, query, notFound) {
  try {
    const found = await query();
    if (found === undefined) return sendJson(res, 404, { error: notFound });
    sendJson(res, 200, found);
  } catch (error) {
    databaseUnavailable(res, 'reading', error);
  }
}
