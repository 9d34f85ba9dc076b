import type { StoredResponse } from '../contract/index.js';
import type { ResponseShaping } from './render.js';

export function toStored(config: ResponseShaping, response: StoredResponse): StoredResponse {
  const headers: Record<string, string> = {};
  for (const name of Object.keys(response.headers)) {
    const lower = name.toLowerCase();
    if (config.replayHeaders.has(lower)) headers[lower] = response.headers[name] as string;
  }
  return {
    status: response.status,
    headers,
    body: config.cipher ? config.cipher.seal(response.body) : response.body,
  };
}

/**
 * A copy of `headers` with `name` set to `value`. V8 takes about 0.5 µs to add a hyphenated name to
 * a copy made by spreading (`{ ...headers, [name]: value }`), ten times this loop (measured on
 * Node 20), and a replay adds two. Names keep their order, as with the spread.
 */
export function withHeader<V>(headers: Record<string, V>, name: string, value: V): Record<string, V> {
  const copy: Record<string, V> = {};
  for (const header of Object.keys(headers)) copy[header] = headers[header] as V;
  copy[name] = value;
  return copy;
}

export function toReplay(config: ResponseShaping, stored: StoredResponse): StoredResponse {
  return {
    status: stored.status,
    // A copy either way: the memory store hands out the record it keeps.
    headers: config.replayedHeader
      ? withHeader(stored.headers, config.replayedHeader, 'true')
      : { ...stored.headers },
    body: config.cipher ? config.cipher.open(stored.body) : stored.body,
  };
}
