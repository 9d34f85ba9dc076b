import net from 'node:net';
import { setImmediate as nextTurn } from 'node:timers/promises';

/**
 * One HTTP/1.1 request written byte for byte over its own connection (`Connection: close`), for
 * what fetch refuses to send: repeated and odd headers, bytes no header may hold, a body in the
 * pieces the caller picks, and a client that hangs up halfway.
 */
export interface RawRequest {
  method: string;
  target: string;
  /** Sent in this order, names as given (any casing, repeats kept), values as bytes. */
  headers: ReadonlyArray<readonly [string, string | Buffer]>;
  body: Buffer;
  /** `Content-Length`, or `Transfer-Encoding: chunked` with chunks of these sizes (cycled). */
  framing: { kind: 'length' } | { kind: 'chunked'; sizes: readonly number[] };
  /** Where the bytes on the wire are cut into separate writes, as fractions of their length. */
  cuts: readonly number[];
  /**
   * When the client hangs up: never; after this fraction of the body (`body`); once the whole
   * request is written (`sent`); at the first byte of the answer (`answer`).
   */
  hangUp: { at: 'never' } | { at: 'body'; fraction: number } | { at: 'sent' } | { at: 'answer' };
}

export interface RawReply {
  status: number;
  /** Lower-case names; a repeated header's values in order. */
  headers: Record<string, string[]>;
  body: Buffer;
}

/**
 * What came back: the answer; `hung-up` when the client hung up before it; `no-answer` when the
 * server closed or reset the connection without a whole one (`detail` says how far it got).
 */
export type RawOutcome =
  | { kind: 'reply'; reply: RawReply }
  | { kind: 'hung-up' }
  | { kind: 'no-answer'; detail: string };

/** A server that has not answered in this long is hung: far past any answer under load. */
const ANSWER_DEADLINE_MS = 20_000;

export function wire(request: RawRequest): { bytes: Buffer; bodyStart: number } {
  const lines = [`${request.method} ${request.target} HTTP/1.1`, 'Host: 127.0.0.1'];
  const head: Buffer[] = [];
  for (const [name, value] of request.headers) head.push(Buffer.from(`${name}: `), Buffer.from(value), CRLF);
  const framing =
    request.framing.kind === 'length'
      ? `Content-Length: ${request.body.length}`
      : 'Transfer-Encoding: chunked';
  const start = Buffer.concat([
    Buffer.from(`${lines.join('\r\n')}\r\n`),
    ...head,
    Buffer.from(`${framing}\r\nConnection: close\r\n\r\n`),
  ]);
  const body =
    request.framing.kind === 'length' ? request.body : chunked(request.body, request.framing.sizes);
  return { bytes: Buffer.concat([start, body]), bodyStart: start.length };
}

const CRLF = Buffer.from('\r\n');

function chunked(body: Buffer, sizes: readonly number[]): Buffer {
  const parts: Buffer[] = [];
  for (let offset = 0, i = 0; offset < body.length; i++) {
    const size = Math.max(1, sizes[i % sizes.length] ?? body.length);
    const chunk = body.subarray(offset, offset + size);
    parts.push(Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, CRLF);
    offset += chunk.length;
  }
  parts.push(Buffer.from('0\r\n\r\n'));
  return Buffer.concat(parts);
}

/** Sends `request` to `port` on loopback; see {@link RawOutcome}. */
export async function exchange(port: number, request: RawRequest): Promise<RawOutcome> {
  const { bytes, bodyStart } = wire(request);
  const end =
    request.hangUp.at === 'body'
      ? bodyStart + Math.floor((bytes.length - bodyStart) * request.hangUp.fraction)
      : bytes.length;
  const cuts = [...new Set(request.cuts.map((cut) => Math.floor(cut * end)))]
    .filter((cut) => cut > 0 && cut < end)
    .sort((a, b) => a - b);
  const socket = net.connect(port, '127.0.0.1');
  const received: Buffer[] = [];
  let hungUp = false;
  const hangUp = () => {
    hungUp = true;
    socket.destroy();
  };
  const closed = new Promise<string | undefined>((resolve) => {
    let error: string | undefined;
    socket.on('error', (cause: NodeJS.ErrnoException) => {
      error = cause.code ?? cause.message;
    });
    socket.on('close', () => resolve(error));
  });
  socket.setTimeout(ANSWER_DEADLINE_MS, () => socket.destroy(new Error('no answer in time')));
  socket.on('data', (chunk: Buffer) => {
    received.push(chunk);
    if (request.hangUp.at === 'answer') hangUp();
  });
  await new Promise<void>((resolve) => {
    socket.once('connect', resolve);
    socket.once('close', resolve);
  });
  let from = 0;
  for (const to of [...cuts, end]) {
    // The server may have answered and closed already (a 413, a 400 for a bad header).
    if (socket.destroyed || socket.writableEnded) break;
    socket.write(bytes.subarray(from, to));
    from = to;
    // A turn between writes, so the server reads each piece on its own.
    await nextTurn();
  }
  if (request.hangUp.at === 'body' || request.hangUp.at === 'sent') hangUp();
  const error = await closed;
  if (hungUp) return { kind: 'hung-up' };
  const reply = parse(Buffer.concat(received));
  if (typeof reply === 'string') return { kind: 'no-answer', detail: error ? `${reply} (${error})` : reply };
  return { kind: 'reply', reply };
}

/** The final answer on a closed connection (interim 1xx answers skipped), or why there is none. */
export function parse(bytes: Buffer): RawReply | string {
  let offset = 0;
  for (;;) {
    const headEnd = bytes.indexOf('\r\n\r\n', offset);
    if (headEnd === -1) return bytes.length === 0 ? 'nothing' : 'an incomplete head';
    const [statusLine = '', ...lines] = bytes.subarray(offset, headEnd).toString('latin1').split('\r\n');
    const status = Number(statusLine.split(' ')[1]);
    offset = headEnd + 4;
    if (status >= 100 && status < 200) continue;
    const headers: Record<string, string[]> = {};
    for (const line of lines) {
      const colon = line.indexOf(':');
      const name = line.slice(0, colon).trim().toLowerCase();
      const values = headers[name] ?? [];
      values.push(line.slice(colon + 1).trim());
      headers[name] = values;
    }
    const rest = bytes.subarray(offset);
    if (headers['transfer-encoding']?.some((value) => /chunked/i.test(value))) {
      const body = dechunk(rest);
      return body === undefined ? 'a chunked body cut short' : { status, headers, body };
    }
    const length = headers['content-length']?.[0];
    if (length === undefined) return { status, headers, body: rest };
    if (rest.length < Number(length)) return `${rest.length} of ${length} body bytes`;
    return { status, headers, body: rest.subarray(0, Number(length)) };
  }
}

/** A chunked body's bytes; `undefined` when it was cut short. */
function dechunk(encoded: Buffer): Buffer | undefined {
  const parts: Buffer[] = [];
  let at = 0;
  for (;;) {
    const lineEnd = encoded.indexOf('\r\n', at);
    if (lineEnd === -1) return undefined;
    const size = Number.parseInt(encoded.subarray(at, lineEnd).toString('latin1'), 16);
    if (Number.isNaN(size)) return undefined;
    if (size === 0) return Buffer.concat(parts);
    if (encoded.length < lineEnd + 2 + size + 2) return undefined;
    parts.push(encoded.subarray(lineEnd + 2, lineEnd + 2 + size));
    at = lineEnd + 2 + size + 2;
  }
}
