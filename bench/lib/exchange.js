import { IncomingMessage, ServerResponse } from 'node:http';
import { Duplex } from 'node:stream';

/** A socket that never closes and discards what is written to it. */
const sink = () =>
  new Duplex({
    read() {},
    write: (_chunk, _encoding, done) => done(),
    writev: (_chunks, done) => done(),
  });

/**
 * One fully received `POST /loans` (JSON `body`, Idempotency-Key `key`) served by `serve` on real
 * node:http objects whose socket discards what is written, so neither the network nor the HTTP
 * parser is measured. Resolves with the status sent.
 * @param {(req: IncomingMessage, res: ServerResponse) => unknown} serve
 * @param {string} key
 * @param {Buffer} body
 * @returns {Promise<number>}
 */
export function exchange(serve, key, body) {
  const socket = sink();
  const req = new IncomingMessage(/** @type {any} */ (socket));
  req.method = 'POST';
  req.url = '/loans';
  // As node's HTTP parser gives them: `headers` and `headersDistinct` are built from these on first read.
  const raw = ['Content-Type', 'application/json', 'Idempotency-Key', key];
  req._addHeaderLines(raw, raw.length);
  req.push(body);
  req.push(null);
  req.complete = true; // as the HTTP parser leaves a fully received request
  const res = new ServerResponse(req);
  res.assignSocket(/** @type {any} */ (socket));
  // A response whose socket closes right after its last write emits 'close' rather than 'finish'.
  return new Promise((resolve) => {
    const done = () => resolve(res.statusCode);
    res.once('finish', done);
    res.once('close', done);
    serve(req, res);
  });
}
