export * from './idempotent.js';
export * from './json-value.js';
