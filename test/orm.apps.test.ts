import { describe } from 'vitest';
import { describeOrmQuickStart } from './support/orm-app.js';
import { hasPostgres } from './support/services.js';

// Every ORM quick start (examples/orm/<orm>/app.js) held to issue 31's HTTP scenarios, each on a
// database of its own; an ORM's quick start joins this list when it lands.
const ORMS = ['drizzle', 'prisma'];

describe.skipIf(!hasPostgres)('ORM quick starts', () => {
  for (const orm of ORMS) describeOrmQuickStart(orm);
});
