/**
 * Debian's headless Chromium driven by playwright-core (no browser download). Every flag that
 * would make it reach the network on its own is set, and every host name but localhost resolves
 * to nothing: a page under test talks to 127.0.0.1 and nowhere else.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser, type Page } from 'playwright-core';

/** where the screenshots of a test run go (kept out of git; CI may keep them as artifacts) */
export const SHOTS = process.env.SNAPLAB_SCREENSHOTS ?? join(process.cwd(), 'test-results', 'dashboard');

export interface TestBrowser {
  browser: Browser;
  page(viewport?: { width: number; height: number }): Promise<Page>;
  shot(page: Page, name: string): Promise<string>;
  close(): Promise<void>;
}

export async function launch(): Promise<TestBrowser> {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium', // Debian's (package chromium, in tools.json)
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--disable-features=MediaRouter,OptimizationHints',
      '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1',
    ],
  });
  mkdirSync(SHOTS, { recursive: true });
  return {
    browser,
    async page(viewport = { width: 1280, height: 800 }) {
      const ctx = await browser.newContext({ viewport });
      const p = await ctx.newPage();
      p.on('dialog', (d) => void d.accept()); // the page's confirm() before a destroy
      return p;
    },
    async shot(page, name) {
      const file = join(SHOTS, `${name}.png`);
      await page.screenshot({ path: file, fullPage: true });
      return file;
    },
    async close() {
      await browser.close(); // (playwright removes the profile it made)
    },
  };
}
