// What every adapter shares: options, node:http plumbing, payload, Web-standard capture, resumes.
export * from './node-http.js';
export * from './options.js';
export * from './overflow.js';
export * from './payload.js';
export * from './resume.js';
export * from './web.js';
