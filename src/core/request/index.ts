export * from './fingerprint.js';
export * from './incoming.js';
export * from './key.js';
export * from './scope.js';
export * from './sha256.js';
