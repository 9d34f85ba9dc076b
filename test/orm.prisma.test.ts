import { describe } from 'vitest';
import { describeOrmQuickStart } from './support/orm-app.js';
import { hasPostgres } from './support/services.js';

describe.skipIf(!hasPostgres)('orm: prisma', () => describeOrmQuickStart('prisma'));
