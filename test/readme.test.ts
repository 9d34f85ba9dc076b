import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

// The quick starts are the example apps the adapter tests start; this keeps the README's copies
// identical to them, so the front door cannot drift from code that is run.
const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');

describe('README quick starts', () => {
  it.each(['express', 'fastify', 'hono', 'koa', 'nestjs', 'node'])(
    'shows examples/%s/app.js verbatim',
    (framework) => {
      const source = readFileSync(
        new URL(`../examples/${framework}/app.js`, import.meta.url),
        'utf8',
      ).trimEnd();
      expect(readme).toContain(`\`\`\`js\n${source}\n\`\`\``);
    },
  );

  it('shows the two commands', () => {
    expect(readme).toContain('npm install && npm start');
    expect(readme).toContain('npm install && npm test');
  });
});
