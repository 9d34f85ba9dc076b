export * from './duration.js';
export * from './resolve.js';
export * from './timer.js';
export * from './types.js';
export * from './validate.js';
