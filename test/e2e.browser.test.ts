import type { Browser, BrowserContext, Page, Request, Route } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { signal } from '../src/testing/signal.js';
import { hasChromium, launchChromium } from './support/browser.js';
import { type LoanDesk, listLoans, startLoanDesk } from './support/loan-desk.js';

const ADMIN_TOKEN = 'browser-test-admin-token';

/**
 * The desk's page and key-store inspector in Debian's Chromium, driven by playwright-core, against
 * the loan desk as a child process (SQLite, atomic mode, DEMO_FAULTS=1 for the lossy switch).
 */

const PENDING = 'loan-desk:pending-intent';
const TEST_TIMEOUT_MS = 60_000;
/**
 * Chromium logs each failed request (network error or 4xx/5xx) as a console error: allowed only in
 * tests that cause such failures on purpose; any other console error fails the test.
 */
const FAILED_REQUEST =
  /^Failed to load resource: (net::ERR_(CONNECTION_RESET|EMPTY_RESPONSE|FAILED|ABORTED)|the server responded with a status of \d{3})/;

const isLoanPost = (request: Request) =>
  request.method() === 'POST' && new URL(request.url()).pathname === '/loans';

describe.skipIf(!hasChromium())('loan desk in a browser', () => {
  let desk: LoanDesk;
  let browser: Browser;
  const adminStatus = async (path: string) =>
    (await fetch(`${desk.baseUrl}${path}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).status;
  let context: BrowserContext;
  let pageErrors: string[];
  let consoleErrors: string[];
  let failingRequests: boolean;

  beforeAll(async () => {
    [desk, browser] = await Promise.all([
      startLoanDesk({ env: { DEMO_FAULTS: '1', ADMIN_TOKEN } }),
      launchChromium(),
    ]);
  }, TEST_TIMEOUT_MS);

  afterAll(async () => {
    await browser?.close();
    await desk?.stop();
  });

  afterEach(async () => {
    await context?.close();
    expect(pageErrors).toEqual([]);
    const unexpected = consoleErrors.filter((text) => !(failingRequests && FAILED_REQUEST.test(text)));
    expect(unexpected).toEqual([]);
  });

  /** A fresh context (empty localStorage) on the desk's page, ready for a press. */
  async function openDesk(
    options: { failingRequests?: boolean; viewport?: { width: number; height: number } } = {},
  ): Promise<Page> {
    pageErrors = [];
    consoleErrors = [];
    failingRequests = options.failingRequests ?? false;
    context = await browser.newContext({ viewport: options.viewport ?? { width: 1100, height: 760 } });
    context.setDefaultTimeout(15_000);
    const page = await context.newPage();
    page.on('pageerror', (error) => pageErrors.push(error.message));
    page.on('console', (message) => {
      if (message.type() === 'error') consoleErrors.push(message.text());
    });
    await page.goto(`${desk.baseUrl}/`);
    await page.locator('#status', { hasText: /^Ready\.$/ }).waitFor();
    return page;
  }

  const issueButton = (page: Page) => page.getByRole('button', { name: 'Issue loan' });

  /** Waits for the intent in flight to end, and answers the status line and the attempt log. */
  async function settled(page: Page): Promise<{ status: string; attempts: string[] }> {
    await page.locator('#status.done, #status.error').waitFor();
    await expect.poll(() => issueButton(page).isEnabled(), { timeout: 15_000 }).toBe(true);
    return {
      status: (await page.locator('#status').textContent()) ?? '',
      attempts: await page.locator('#attempts li').allTextContents(),
    };
  }

  async function shownLoanIds(page: Page): Promise<string[]> {
    await page.waitForLoadState('networkidle');
    return page
      .locator('#loans tbody tr')
      .evaluateAll((rows) => rows.map((row) => row.getAttribute('data-loan-id')!));
  }

  it(
    'one press lends one book and shows the loan',
    async () => {
      const page = await openDesk();
      const before = (await listLoans(desk.baseUrl)).length;
      await page.getByLabel('Book').selectOption('K-02');
      await issueButton(page).click();
      const { status, attempts } = await settled(page);
      expect(status).toMatch(/^Loan #\d+ issued: “Invisible Cities” to Ada Okafor/);
      expect(attempts).toEqual(['attempt 1: 201']);
      const loans = await listLoans(desk.baseUrl);
      expect(loans).toHaveLength(before + 1);
      const id = String(loans.at(-1)!.id);
      expect(status).toContain(`#${id}`);
      expect((await shownLoanIds(page)).filter((shown) => shown === id)).toHaveLength(1);
      expect(await page.evaluate((name) => localStorage.getItem(name), PENDING)).toBeNull();
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'three presses whose every answer is lost once after the desk answered lend exactly three books',
    async () => {
      const page = await openDesk({ failingRequests: true });
      const before = (await listLoans(desk.baseUrl)).length;
      const sent: string[] = [];
      const lost = new Set<string>();
      await page.route('**/loans', async (route: Route) => {
        const request = route.request();
        if (!isLoanPost(request)) return route.continue();
        const key = request.headers()['idempotency-key']!;
        sent.push(key);
        if (lost.has(key)) return route.continue();
        lost.add(key);
        await route.fetch();
        await route.abort('connectionreset');
      });
      for (const isbn of ['K-03', 'K-04', 'K-05']) {
        await page.getByLabel('Book').selectOption(isbn);
        await issueButton(page).click();
        const { status, attempts } = await settled(page);
        expect(status).toMatch(/^Loan #\d+ issued: .* the book was lent once\.$/);
        expect(attempts).toEqual([
          'attempt 1: network error — retrying with the same key',
          'attempt 2: 201, replayed',
        ]);
      }
      expect(lost.size).toBe(3);
      expect(sent).toHaveLength(6);
      for (const key of lost) expect(sent.filter((k) => k === key)).toHaveLength(2);
      const loans = await listLoans(desk.baseUrl);
      expect(loans).toHaveLength(before + 3);
      const mine = loans.slice(before).map((loan) => String(loan.id));
      const shown = await shownLoanIds(page);
      for (const id of mine) expect(shown.filter((s) => s === id)).toHaveLength(1);
      expect(new Set(shown).size).toBe(shown.length);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'a reload while a loan is pending resends it with the same key: one loan',
    async () => {
      const page = await openDesk({ failingRequests: true });
      const before = (await listLoans(desk.baseUrl)).length;
      const keys: string[] = [];
      const firstAnswered = signal();
      const reloaded = signal();
      await page.route('**/loans', async (route: Route) => {
        const request = route.request();
        if (!isLoanPost(request)) return route.continue();
        keys.push(request.headers()['idempotency-key']!);
        if (keys.length > 1) return route.continue();
        // The desk lends the book, but the page is reloaded before the answer reaches it.
        await route.fetch();
        firstAnswered.resolve();
        await reloaded.promise;
        await route.abort('aborted').catch(() => {});
      });
      await page.getByLabel('Book').selectOption('K-06');
      await issueButton(page).click();
      await firstAnswered.promise;
      const pending = JSON.parse((await page.evaluate((name) => localStorage.getItem(name), PENDING))!);
      expect(pending).toMatchObject({ key: keys[0], body: { member: 'U-1001', isbn: 'K-06' } });
      expect(await issueButton(page).isDisabled()).toBe(true);
      expect((await listLoans(desk.baseUrl)).length).toBe(before + 1);

      await page.reload();
      reloaded.resolve();
      const { status, attempts } = await settled(page);
      expect(keys).toEqual([pending.key, pending.key]);
      expect(attempts).toEqual(['attempt 1: 201, replayed']);
      expect(status).toMatch(/^Loan #\d+ issued: “The Master and Margarita”/);
      expect((await listLoans(desk.baseUrl)).length).toBe(before + 1);
      expect(await page.evaluate((name) => localStorage.getItem(name), PENDING)).toBeNull();
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'the lossy-network switch: the desk loses the first answer and the retry receives the same loan',
    async () => {
      const page = await openDesk({ failingRequests: true });
      const before = (await listLoans(desk.baseUrl)).length;
      await page.getByLabel('Lossy network').check();
      await issueButton(page).click();
      const { status, attempts } = await settled(page);
      expect(attempts).toEqual([
        'attempt 1: network error — retrying with the same key',
        'attempt 2: 201, replayed',
      ]);
      expect(status).toMatch(/the desk replayed it, so the book was lent once\.$/);
      expect((await listLoans(desk.baseUrl)).length).toBe(before + 1);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'errors are told in words; an unanswered loan stays pending and is resent with its key',
    async () => {
      const page = await openDesk({ failingRequests: true });
      const answers: Array<{ status: number; body: object }> = [
        { status: 422, body: { error: 'validation', field: 'isbn', message: 'No book with isbn K-01.' } },
        { status: 422, body: { error: 'validation', field: 'member', message: 'No member with id U-1001.' } },
        { status: 409, body: { error: 'key_conflict', key: 'k' } },
      ];
      const keys: string[] = [];
      await page.route('**/loans', async (route: Route) => {
        if (!isLoanPost(route.request())) return route.continue();
        keys.push(route.request().headers()['idempotency-key']!);
        const answer = answers[0] ?? { status: 503, body: { error: 'database_unavailable' } };
        if (answers.length > 0) answers.shift();
        await route.fulfill({ status: answer.status, json: answer.body });
      });
      const expected = [
        'That book is not in the catalogue; nothing was lent.',
        'That member is not registered; nothing was lent.',
        /^This loan’s key was already used for a different loan, so nothing was lent\./,
      ];
      for (const text of expected) {
        await issueButton(page).click();
        const { status } = await settled(page);
        expect(status).toMatch(text);
        expect(await page.evaluate((name) => localStorage.getItem(name), PENDING)).toBeNull();
      }
      expect(new Set(keys).size).toBe(3);

      await issueButton(page).click();
      const { status, attempts } = await settled(page);
      expect(status).toMatch(
        /^The desk’s database is not answering\. Press Issue loan to send the same loan again/,
      );
      expect(attempts.at(-1)).toBe('attempt 5: 503');
      const pending = JSON.parse((await page.evaluate((name) => localStorage.getItem(name), PENDING))!);
      expect(await page.getByLabel('Book').isDisabled()).toBe(true);
      await page.unroute('**/loans');
      await issueButton(page).click();
      expect((await settled(page)).status).toMatch(/^Loan #\d+ issued/);
      expect(keys.slice(3)).toEqual(Array(5).fill(pending.key));
      expect(await adminStatus(`/admin/keys/anonymous/${pending.key}`)).toBe(200);
      expect(await page.getByLabel('Book').isDisabled()).toBe(false);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'keyboard only: labelled controls in order, Enter issues the loan, the status is announced',
    async () => {
      const page = await openDesk();
      const before = (await listLoans(desk.baseUrl)).length;
      for (const label of ['Member', 'Book', 'Date', 'Lossy network'])
        await expect(page.getByLabel(label).count()).resolves.toBe(1);
      expect(await page.locator('#status').getAttribute('aria-live')).toBe('polite');
      expect(await page.locator('#status').getAttribute('role')).toBe('status');

      const order: string[] = [];
      for (let i = 0; i < 12; i++) {
        await page.keyboard.press('Tab');
        const id = await page.evaluate(() => document.activeElement?.id || document.activeElement?.tagName);
        if (order.at(-1) !== id) order.push(id!);
      }
      const controls = order.filter((id) => ['member', 'book', 'issued-at', 'issue', 'lossy'].includes(id));
      expect(controls).toEqual(['member', 'book', 'issued-at', 'issue', 'lossy']);

      await page.locator('body').focus();
      await page.keyboard.press('Tab');
      while ((await page.evaluate(() => document.activeElement?.id)) !== 'member')
        await page.keyboard.press('Tab');
      await page.keyboard.press('ArrowDown');
      expect(await page.getByLabel('Member').inputValue()).toBe('U-1002');
      while ((await page.evaluate(() => document.activeElement?.id)) !== 'issue')
        await page.keyboard.press('Tab');
      await page.keyboard.press('Enter');
      const { status } = await settled(page);
      expect(status).toMatch(/^Loan #\d+ issued: .* to Bruno Salgado/);
      const loans = await listLoans(desk.baseUrl);
      expect(loans).toHaveLength(before + 1);
      expect(loans.at(-1)).toMatchObject({ member: 'U-1002' });
      expect(await page.evaluate(() => document.activeElement?.id)).toBe('issue');
    },
    TEST_TIMEOUT_MS,
  );

  it(
    '/keys on a 375 px wide phone: every Delete button is within the viewport',
    async () => {
      const viewport = { width: 375, height: 667 };
      const page = await openDesk({ viewport });
      for (const isbn of ['K-09', 'K-10']) {
        await page.getByLabel('Book').selectOption(isbn);
        await issueButton(page).click();
        await settled(page);
      }
      await page.goto(`${desk.baseUrl}/keys`);
      await page.getByLabel('Admin token').fill(ADMIN_TOKEN);
      await page.getByRole('button', { name: 'Use token' }).click();
      // The load before the token was refused; the browser logs that 401.
      consoleErrors = consoleErrors.filter((text) => !/status of 401/.test(text));
      await page.locator('#keys tbody tr').first().waitFor();
      const buttons = page.getByRole('button', { name: /^Delete key / });
      expect(await buttons.count()).toBeGreaterThanOrEqual(2);
      for (const button of await buttons.all()) {
        await button.scrollIntoViewIfNeeded();
        const box = (await button.boundingBox())!;
        expect(box.x).toBeGreaterThanOrEqual(0);
        expect(box.x + box.width).toBeLessThanOrEqual(viewport.width);
      }
      // Nothing is wider than the screen: the page never scrolls sideways.
      expect(await page.evaluate(() => document.documentElement.scrollWidth)).toBeLessThanOrEqual(
        viewport.width,
      );
    },
    TEST_TIMEOUT_MS,
  );

  it(
    '/keys lists the completed keys, filters by key and deletes one after confirmation',
    async () => {
      const page = await openDesk();
      const keys: string[] = [];
      page.on('request', (request) => {
        if (isLoanPost(request)) keys.push(request.headers()['idempotency-key']!);
      });
      for (const isbn of ['K-07', 'K-08']) {
        await page.getByLabel('Book').selectOption(isbn);
        await issueButton(page).click();
        await settled(page);
      }
      expect(keys).toHaveLength(2);

      await page.goto(`${desk.baseUrl}/keys`);
      // The admin API wants the token: the page asks for it and keeps it for the session.
      await page.getByLabel('Admin token').fill(ADMIN_TOKEN);
      await page.getByRole('button', { name: 'Use token' }).click();
      // The first load, before the token, was refused; the browser logs that 401.
      const refused = consoleErrors.filter((text) => /status of 401/.test(text));
      expect(refused).toHaveLength(1);
      consoleErrors = consoleErrors.filter((text) => !refused.includes(text));
      for (const key of keys) {
        const row = page.locator(`#keys tbody tr[data-key="${key}"]`);
        await row.waitFor();
        const cells = await row.locator('td').allTextContents();
        // A loan is one step: no steps done to list.
        expect(cells.slice(0, 5)).toEqual([key, 'anonymous', 'completed', '201', '—']);
        expect(cells[6]).toMatch(/^23 h 59 min|^24 h 0 min/);
        expect(cells[7]).toBe('—');
      }
      await page.getByLabel('Filter by key').fill(keys[0]!.slice(0, 13));
      expect(
        await page
          .locator('#keys tbody tr')
          .evaluateAll((rows) => rows.map((r) => r.getAttribute('data-key'))),
      ).toEqual([keys[0]]);
      await page.getByLabel('Filter by key').fill('');

      const asked: string[] = [];
      page.once('dialog', (dialog) => {
        asked.push(dialog.message());
        void dialog.accept();
      });
      await page.getByRole('button', { name: `Delete key ${keys[0]}` }).click();
      await page.locator(`#keys tbody tr[data-key="${keys[0]}"]`).waitFor({ state: 'detached' });
      expect(asked[0]).toContain(keys[0]);
      expect(await page.locator('#status').textContent()).toBe(`Key ${keys[0]} deleted.`);
      expect(await adminStatus(`/admin/keys/anonymous/${keys[0]}`)).toBe(404);
      expect(await adminStatus(`/admin/keys/anonymous/${keys[1]}`)).toBe(200);

      page.once('dialog', (dialog) => void dialog.dismiss());
      await page.getByRole('button', { name: `Delete key ${keys[1]}` }).click();
      expect(await adminStatus(`/admin/keys/anonymous/${keys[1]}`)).toBe(200);
      await page.locator(`#keys tbody tr[data-key="${keys[1]}"]`).waitFor();
    },
    TEST_TIMEOUT_MS,
  );
});
