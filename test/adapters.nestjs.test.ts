import { describeAdapterConformance, memory, postgres, redis, sqlite } from './conformance/adapter-suite.js';
import { nestAdapter } from './support/nest-harness.js';
import { describeNestSpecifics } from './support/nest-specifics.js';

describeAdapterConformance(nestAdapter('nest 12 (platform-express)', 'express'), [
  memory,
  sqlite,
  postgres,
  redis,
]);
describeAdapterConformance(nestAdapter('nest 12 (platform-fastify)', 'fastify'), [
  memory,
  sqlite,
  postgres,
  redis,
]);

describeNestSpecifics('nest 12 (platform-express)', 'express');
describeNestSpecifics('nest 12 (platform-fastify)', 'fastify');
