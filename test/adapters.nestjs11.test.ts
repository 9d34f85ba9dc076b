import { expect, it, vi } from 'vitest';
import { describeNest } from './support/nest-specifics.js';

// NestJS 11 lives in test/nest11's own tree (its packages import each other by name, and the root
// has 12): every @nestjs import of this file's graph, the adapter's included, is served from it.
const { nest11 } = vi.hoisted(() => ({
  nest11: (id: string) => async () => (await import('./support/nest11.js')).requireNest11(id),
}));
vi.mock('@nestjs/common', nest11('@nestjs/common'));
vi.mock('@nestjs/common/constants.js', nest11('@nestjs/common/constants.js'));
vi.mock(
  '@nestjs/common/enums/route-paramtypes.enum.js',
  nest11('@nestjs/common/enums/route-paramtypes.enum.js'),
);
vi.mock('@nestjs/core', nest11('@nestjs/core'));
vi.mock('@nestjs/platform-express', nest11('@nestjs/platform-express'));
vi.mock('@nestjs/platform-fastify', nest11('@nestjs/platform-fastify'));

it('runs NestJS 11', async () => {
  const { requireNest11 } = await import('./support/nest11.js');
  expect(requireNest11('@nestjs/core/package.json').version).toMatch(/^11\./);
  const { NestFactory } = await import('@nestjs/core');
  expect(NestFactory).toBe(requireNest11('@nestjs/core').NestFactory);
  const { Controller } = await import('@nestjs/common');
  expect(Controller).toBe(requireNest11('@nestjs/common').Controller);
});

describeNest('nest 11');
