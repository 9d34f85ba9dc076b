import { cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser, Page, Request } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createFaultProxy } from '../examples/library-loans/faults/fault-proxy.js';
import { hasChromium, launchChromium } from './support/browser.js';
import { checkQuickStart, pack, run, serveOneReplay } from './support/quick-start.js';

/**
 * examples/nextjs as a user runs it: a fresh project with the packed tarball and `next@16`, react
 * and react-dom from the npm registry, `next build`, then `next start`: the route handler's replay,
 * and the order form's server action (`retrysafe/next`) in Debian's Chromium. Installing and
 * building take minutes, so CI runs this file on its first Node only (`.ci/run` sets
 * RETRYSAFE_CI_REPEAT on the others).
 */
const root = join(import.meta.dirname, '..');
// Inherited by `next build` and `next start`: no telemetry to send from a test.
process.env.NEXT_TELEMETRY_DISABLED = '1';
const repeat = process.env.RETRYSAFE_CI_REPEAT === '1';
if (repeat) console.warn('\nexamples.nextjs: skipped on this Node, run on CI’s first one\n');

const TEST_TIMEOUT_MS = 60_000;
// expect.poll gives up after 1 s unless told: an answer on a loaded machine may take longer.
const POLL = { timeout: 15_000 };
const isAction = (request: Request) =>
  request.method() === 'POST' && request.headers()['next-action'] !== undefined;

describe.skipIf(repeat)('examples/nextjs on Next.js 16 (next build, next start)', () => {
  let work: string;
  let next: string;
  const start = (check?: (url: string) => Promise<void>) =>
    serveOneReplay({
      command: join(next, 'node_modules/.bin/next'),
      args: ['start', '-H', '127.0.0.1'],
      cwd: next,
      ready: /Ready in/,
      check,
    });

  beforeAll(() => {
    work = mkdtempSync(join(tmpdir(), 'retrysafe-next-'));
    const { tarball } = pack(work);
    next = join(work, 'nextjs');
    mkdirSync(next);
    writeFileSync(
      join(next, 'package.json'),
      JSON.stringify({ name: 'nextjs', private: true, type: 'module' }),
    );
    run(
      'npm',
      ['install', tarball, 'next@16', 'react', 'react-dom', '--prefer-offline', '--no-audit', '--no-fund'],
      next,
      240_000,
    );
    cpSync(join(root, 'examples/nextjs/app'), join(next, 'app'), { recursive: true });
    run(join(next, 'node_modules/.bin/next'), ['build'], next, 240_000);
  }, 600_000);

  afterAll(() => {
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it('the route handler: 400 without a key or with a bad body, then a replay', {
    timeout: TEST_TIMEOUT_MS,
  }, async () => {
    await start((url) => checkQuickStart(url));
  });

  describe.skipIf(!hasChromium())('the order form (a server action, its key minted with the form)', () => {
    let browser: Browser;
    beforeAll(async () => {
      browser = await launchChromium();
    }, TEST_TIMEOUT_MS);
    afterAll(async () => {
      await browser?.close();
    });

    /** A fresh page at `url`, the action POSTs it sends and the page errors it raises counted. */
    async function openForm(url: string) {
      const context = await browser.newContext();
      context.setDefaultTimeout(15_000);
      const page = await context.newPage();
      const seen = { actions: 0, answered: 0, pageErrors: [] as string[] };
      page.on('pageerror', (error) => seen.pageErrors.push(error.message));
      page.on('request', (request) => {
        if (isAction(request)) seen.actions += 1;
      });
      // Its answer's head: Chromium reports an action's streamed body finished only now and then.
      page.on('response', (response) => {
        if (isAction(response.request())) seen.answered += 1;
      });
      await page.goto(url);
      // Hydrated: React has taken the form over (a press before that is a native, JS-less POST).
      await page.waitForFunction(() =>
        Object.keys(document.querySelector('form')!).some((name) => name.startsWith('__reactProps')),
      );
      return { page, seen, close: () => context.close() };
    }

    const status = (page: Page) => page.getByRole('status');
    const button = (page: Page) => page.getByRole('button', { name: 'Place order' });
    const orders = async (url: string) => (await fetch(`${url}/orders`)).json();

    it('two renders mint two keys', { timeout: TEST_TIMEOUT_MS }, async () => {
      await start(async (url) => {
        const keys = [];
        for (let i = 0; i < 2; i++) {
          const { page, close } = await openForm(url);
          keys.push(await page.locator('input[name="idempotency-key"]').inputValue());
          await close();
        }
        expect(keys[0]).toMatch(/^[0-9a-f-]{36}$/);
        expect(keys[1]).not.toBe(keys[0]);
      });
    });

    it('a double-clicked submit: one order, shown', { timeout: TEST_TIMEOUT_MS }, async () => {
      await start(async (url) => {
        const { page, seen, close } = await openForm(url);
        await page.getByLabel('Item').fill('lamp');
        await button(page).dblclick();
        // Both submissions reach the server and are answered: the second with the first's order.
        await expect.poll(() => seen.answered, POLL).toBe(2);
        await expect.poll(() => status(page).textContent(), POLL).toBe('Order #1: lamp');
        expect(seen.actions).toBe(2);
        expect(await orders(url)).toEqual([{ id: 1, item: 'lamp' }]);
        expect(seen.pageErrors).toEqual([]);
        await close();
      });
    });

    it('the answer lost on the way back, the form resubmitted: one order, the same order shown', {
      timeout: TEST_TIMEOUT_MS,
    }, async () => {
      await start(async (url) => {
        const target = new URL(url);
        const proxy = createFaultProxy({ targetPort: Number(target.port), dropHeader: 'x-lose' });
        const proxyUrl = `http://127.0.0.1:${await proxy.start()}`;
        try {
          const { page, seen, close } = await openForm(proxyUrl);
          // The first action's answer is dropped by the proxy after Next has run the action.
          let lose = true;
          await page.route('**/*', (route) => {
            const request = route.request();
            if (!lose || !isAction(request)) return route.continue();
            lose = false;
            return route.continue({ headers: { ...request.headers(), 'x-lose': '1' } });
          });
          await button(page).click();
          await expect.poll(() => status(page).textContent(), POLL).toMatch(/^No answer from the server/);
          expect(proxy.stats.dropped).toBe(1);
          expect(await orders(url)).toEqual([{ id: 1, item: 'book' }]);

          await button(page).click();
          await expect.poll(() => status(page).textContent(), POLL).toBe('Order #1: book');
          expect(seen.actions).toBe(2);
          expect(await orders(url)).toEqual([{ id: 1, item: 'book' }]);
          expect(seen.pageErrors).toEqual([]);
          await close();
        } finally {
          await proxy.close();
        }
      });
    });
  });
});
