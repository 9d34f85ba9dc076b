// `npm run screenshots`: docs/loan-desk.png and docs/keys.png, taken in Debian's chromium from a
// loan desk on a fresh SQLite file with DEMO_FAULTS=1, behind its fault proxy (the last loan goes
// through the lossy switch).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startLoanDesk } from '../examples/library-loans/app.js';
import { readConfig } from '../examples/library-loans/config.js';
import { behindFaultFront, startFaultFront } from '../examples/library-loans/faults/fault-front.js';
import { launchChromium } from '../test/support/browser.js';

const docs = fileURLToPath(new URL('../docs/', import.meta.url));
const dir = mkdtempSync(path.join(tmpdir(), 'loan-desk-screenshots-'));
const config = readConfig({
  DATABASE_URL: path.join(dir, 'library.db'),
  PORT: '0',
  DEMO_FAULTS: '1',
  ADMIN_LOOPBACK: '1',
});
const desk = await startLoanDesk(behindFaultFront(config), { setup: true });
const front = await startFaultFront(config, desk.port);
const url = `http://127.0.0.1:${front.port}`;
const browser = await launchChromium();
try {
  // A caller with a credential, so the inspector shows a second scope.
  await fetch(`${url}/loans`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'idempotency-key': 'mobile-app-7f3c',
      authorization: 'Bearer branch-north-terminal',
    },
    body: JSON.stringify({ member: 'U-1004', isbn: 'K-09', issuedAt: '2026-11-28' }),
  });
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  page.setDefaultTimeout(15_000);
  await page.goto(`${url}/`);
  await page.getByText('Ready.').waitFor();
  const issue = async (member, isbn) => {
    await page.getByLabel('Member').selectOption(member);
    await page.getByLabel('Book').selectOption(isbn);
    await page.getByRole('button', { name: 'Issue loan' }).click();
    await page.locator('#status.done').waitFor();
  };
  await issue('U-1002', 'K-02');
  await issue('U-1007', 'K-05');
  await page.getByLabel('Lossy network').check();
  await issue('U-1001', 'K-01');
  await page.screenshot({ path: path.join(docs, 'loan-desk.png'), fullPage: true });
  await page.goto(`${url}/keys`);
  await page.locator('#keys tbody tr').nth(3).waitFor();
  await page.screenshot({ path: path.join(docs, 'keys.png') });
  console.log('wrote docs/loan-desk.png and docs/keys.png');
} finally {
  await browser.close();
  await desk.close();
  await front.close();
  rmSync(dir, { recursive: true, force: true });
}
