export * from './adapter-contract.js';
export * from './atomic-mode.js';
export * from './create.js';
export * from './deadline.js';
export * from './handler-context.js';
export * from './lease-keeper.js';
export * from './lease-mode.js';
export * from './outcomes.js';
