/**
 * Web pages in a real browser: Debian's Chromium driven by playwright-core (no browser download),
 * and pages served from an origin of their own on loopback, as a developer's dev server would.
 * Files using it carry `// @module-tag chromium` (system-packages.ts).
 */
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { chromium, type Browser, type Page } from "playwright-core";
import { chromiumExecutable } from "./system-packages.js";

/** Starts headless Chromium (as root it needs --no-sandbox). */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: chromiumExecutable(), args: ["--no-sandbox"] });
}

/** A page server on loopback: `origin` (`http://127.0.0.1:PORT`, or `http://localhost:PORT`) serves `html` at `/`. */
export interface PageServer {
  readonly origin: string;
  close(): Promise<void>;
}

export async function servePage(html: string, host: "127.0.0.1" | "localhost" = "127.0.0.1"): Promise<PageServer> {
  const server = http.createServer((req, res) => {
    if (req.url === "/" || req.url?.startsWith("/?")) {
      res.writeHead(200, { "content-type": "text/html; charset=utf-8" });
      res.end(html);
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    origin: `http://${host}:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Opens `url` in a fresh page, collecting its console errors (a page under test should have none). */
export async function openPage(browser: Browser, url: string): Promise<{ page: Page; consoleErrors: string[] }> {
  const page = await browser.newPage();
  const consoleErrors: string[] = [];
  page.on("console", (message) => {
    if (message.type() === "error") consoleErrors.push(message.text());
  });
  page.on("pageerror", (error) => consoleErrors.push(error.message));
  await page.goto(url);
  return { page, consoleErrors };
}

/** `<script type="module">` holding `code` (a bundle of `@berth/shared/testing/browser-bundle`), safe inside HTML. */
export function moduleScript(code: string): string {
  return `<script type="module">${code.replaceAll("</script", "<\\/script")}</script>`;
}
