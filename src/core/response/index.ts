export * from './collector.js';
export * from './crypto.js';
export * from './encoding.js';
export * from './render.js';
export * from './stored.js';
export * from './view.js';
