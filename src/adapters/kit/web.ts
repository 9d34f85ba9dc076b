import type { CapturedResponse, ResponseCollector, StoredResponse } from '../../core/adapter.js';
import { DRAIN_MAX_BYTES, DRAIN_MAX_MS, feed, keptThenRest, type ReadChunk } from './overflow.js';

// Response capture and replay shared by the adapters that see Web-standard Request/Response
// objects (Hono, retrysafe/fetch).

/** Path and query string of a request URL. */
export function pathAndQuery(url: string): string {
  const parsed = new URL(url);
  return parsed.pathname + parsed.search;
}

// These statuses forbid a body; the Response constructor throws on an empty one.
const NULL_BODY = new Set([101, 103, 204, 205, 304]);

/** A fresh Response for a stored one (a replay, or an engine error's rendering). */
export function toResponse(stored: StoredResponse): Response {
  return new Response(NULL_BODY.has(stored.status) ? null : (stored.body as Uint8Array<ArrayBuffer>), {
    status: stored.status,
    headers: stored.headers,
  });
}

/**
 * Reads the handler's Response into the engine's collector and gives back the response to send in
 * its place (its body was consumed): the whole body when it was kept; past `maxResponseBytes`,
 * what was read followed by the rest of the stream (lease mode), or nothing (atomic mode). The
 * response sent carries `answerHeaders` too (the engine's, for the request's key), unless the
 * handler set them itself.
 */
export async function captureWebResponse(
  collector: ResponseCollector,
  res: Response,
  answerHeaders: Readonly<Record<string, string>>,
): Promise<{ response: CapturedResponse; send: Response }> {
  let headers = res.headers;
  for (const name in answerHeaders) {
    if (headers.has(name)) continue;
    if (headers === res.headers) headers = new Headers(headers);
    headers.set(name, answerHeaders[name] as string);
  }
  const init = { status: res.status, statusText: res.statusText, headers };
  const captured = () => collector.response(res.status, (name) => res.headers.get(name));
  if (res.body === null) return { response: captured(), send: new Response(null, init) };

  const reader = res.body.getReader();
  const read = (() => reader.read()) as ReadChunk;
  const state = await feed(collector, read);
  if (state === 'keep') {
    const response = captured();
    const body = NULL_BODY.has(res.status) ? null : (response.body as Uint8Array<ArrayBuffer>);
    return { response, send: new Response(body, init) };
  }
  if (state === 'drop') {
    await reader.cancel();
    return { response: captured(), send: new Response(null, init) };
  }
  const chunks = keptThenRest(collector, read);
  const rest = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = await chunks.next();
      if (next.done) controller.close();
      else controller.enqueue(next.value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  return { response: captured(), send: new Response(rest, init) };
}

/**
 * Reads and drops what nobody read of a refused request's body (a bad key, a body too large),
 * within the bounds node:http's adapters drain by, before the refusal is answered. A Node server
 * in front (@hono/node-server, Next.js) closes the connection after the answer when the client
 * asked it to, and closing a socket with unread bytes resets it: a client still uploading then
 * sees that reset instead of the answer. Elsewhere (workers, Deno, Bun) it only reads the rest of
 * an upload the client sends anyway. A body read already, or being read, is left alone.
 */
export async function dropUnreadBody(request: Request): Promise<void> {
  // `bodyUsed` first: @hono/node-server's Request builds its body stream when `body` is read.
  if (request.bodyUsed) return;
  const body = request.body;
  if (body === null || body.locked) return;
  const reader = body.getReader();
  const timer = setTimeout(() => void reader.cancel(), DRAIN_MAX_MS);
  let bytes = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      bytes += value.byteLength;
      if (bytes > DRAIN_MAX_BYTES) return void reader.cancel();
    }
  } catch {
    // The client went away: there is nothing left to drop.
  } finally {
    clearTimeout(timer);
  }
}
