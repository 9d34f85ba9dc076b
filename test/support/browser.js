import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

/** Debian's chromium package; `.ci/run` installs it when missing (no browser download). */
export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';

const ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/**
 * Starts Chromium headless with a fresh profile (no cookies, no localStorage) in a temp directory;
 * `close()` ends it and removes the profile.
 */
export async function launchChromium({ timeoutMs = 30_000 } = {}) {
  const profile = mkdtempSync(path.join(tmpdir(), 'retrysafe-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ARGS,
    timeout: timeoutMs,
    viewport: { width: 1100, height: 760 },
  });
  context.setDefaultTimeout(10_000);
  return {
    context,
    async close() {
      await context.close().catch(() => {});
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
