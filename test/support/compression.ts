/** A JSON answer large enough for any compression middleware's threshold. */
export const catalogPage = {
  books: Array.from({ length: 100 }, (_, i) => ({ isbn: `K-${i}`, title: `Book ${i}` })),
};

/**
 * Accept-Encoding values of a retry that does not take gzip, by name: `undefined` sends none.
 * The key is derived from the name, so each case names its own operation.
 */
export const RETRIES_WITHOUT_GZIP: ReadonlyArray<[name: string, acceptEncoding: string | undefined]> = [
  ['identity', 'identity'],
  ['no Accept-Encoding', undefined],
  ['br but not gzip', 'gzip;q=0, br'],
];
