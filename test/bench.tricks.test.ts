import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

// The bench's `tricks` scenario takes each speed trick out of a copy of src/ by a patch: a patch
// that stopped applying after a change to its file fails that scenario only inside a 30-minute
// `npm run bench` (it did once, on 2026-12-04). Each must apply to the tree as it is.
const root = join(import.meta.dirname, '..');
const patches = readdirSync(join(root, 'bench', 'tricks')).filter((name) => name.endsWith('.patch'));

describe('bench/tricks patches', () => {
  it('there are patches to check', () => expect(patches.length).toBeGreaterThan(0));

  it.each(patches)('%s applies to src/ as it is', (name) => {
    const check = () =>
      execFileSync('git', ['apply', '--check', join('bench', 'tricks', name)], { cwd: root, stdio: 'pipe' });
    expect(check).not.toThrow();
  });
});
