import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';

/** Debian's chromium package; `.ci/run` installs it when missing (playwright downloads no browser). */
export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';

/**
 * Whether the browser tests can run. With CI=true a missing chromium is a failure; elsewhere the
 * tests are skipped with a loud message, never silently passed.
 */
export function hasChromium() {
  if (existsSync(CHROMIUM)) return true;
  const message = `${CHROMIUM} is missing (apt-get install -y chromium)`;
  if (process.env.CI === 'true') throw new Error(`${message}; CI=true makes the browser tests mandatory`);
  console.warn(`\n!!!!!!!! SKIPPING BROWSER TESTS: ${message} !!!!!!!!\n`);
  return false;
}

/**
 * Starts Chromium headless. Playwright gives it a fresh temporary profile (`--user-data-dir`) and
 * removes it on `close()`; each `browser.newContext()` then starts with empty storage.
 */
export function launchChromium({ timeoutMs = 30_000 } = {}) {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: timeoutMs,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}
