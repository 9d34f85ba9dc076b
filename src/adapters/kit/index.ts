// What every adapter shares: options, node:http plumbing, payload and Web-standard capture.
export * from './node-http.js';
export * from './options.js';
export * from './overflow.js';
export * from './payload.js';
export * from './web.js';
