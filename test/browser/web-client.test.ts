// @module-tag chromium
/**
 * `@berth/client` in Chromium: a page on its own loopback origin (a dev server's) loads the client
 * as a bundler would give it (the package's `browser` entry, bundled for the browser), and calls
 * the sessions service allowed for that origin, with the token: it appends, watches its session
 * and sees live an append made from Node, reads a refusal as a BerthClientError with its code,
 * reason and typed details, holds a lock on a Hold stream named after its tab, and is refused
 * admit as a stream fetch cannot make. A page on an origin the service does not allow gets a
 * BerthClientError that names the origin and the flag, and changes nothing. The allowed page logs
 * no console error.
 */
import * as path from "node:path";
import { Code } from "@connectrpc/connect";
import { Berth } from "@berth/client";
import type { HeldLock } from "@berth/client/web";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleForBrowser } from "@berth/shared/testing/browser-bundle";
import { launchChromium, moduleScript, openPage, servePage, type PageServer } from "../harness/browser.js";
import { makeTempDir, startService, stopAll, type StartedService } from "../harness.js";

const TOKEN = "page-token";

/**
 * The page's module: the client as `@berth/client` resolves under the browser condition, as a
 * global, and `refusalOf(call)`, what a call that failed reads as in the page, as plain JSON.
 */
const PAGE_MODULE = `
import * as client from "@berth/client";
globalThis.berthClient = client;
globalThis.refusalOf = async (call) => {
  try {
    await call;
    return undefined;
  } catch (error) {
    return {
      isBerthClientError: error instanceof client.BerthClientError,
      code: error.code,
      reason: error.reason,
      message: error.message,
      metadata: error.errorInfo?.metadata,
      facts: error.facts,
      currentSeq: error.seqConflict === undefined ? undefined : String(error.seqConflict.currentSeq),
    };
  }
};
`;

/** What `refusalOf` answers. */
interface PageRefusal {
  isBerthClientError: boolean;
  code: Code;
  reason: string | undefined;
  message: string;
  metadata: Record<string, string> | undefined;
  facts: Record<string, unknown>;
  currentSeq: string | undefined;
}

let browser: Browser;
let allowedPage: PageServer;
let otherPage: PageServer;
let sessions: StartedService;
let fromNode: Berth;

beforeAll(async () => {
  const { code } = await bundleForBrowser(PAGE_MODULE, import.meta.dirname);
  // An icon of its own: the browser would ask the page server for /favicon.ico, a 404 on the console.
  const html = `<!doctype html><title>berth client</title><link rel="icon" href="data:,">${moduleScript(code)}`;
  [browser, allowedPage, otherPage] = await Promise.all([launchChromium(), servePage(html, "localhost"), servePage(html)]);
  sessions = await startService("sessions", { args: ["--cors-origin", allowedPage.origin], env: { BERTH_TOKEN: TOKEN } });
  fromNode = new Berth({ sessionsUrl: sessions.url("sessions"), token: TOKEN, env: {} });
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await Promise.all([allowedPage?.close(), otherPage?.close()]);
  await stopAll();
});

/** A page of `origin` with the client loaded (`(globalThis as unknown as PageGlobals).berthClient`), and the console errors it logs. */
async function clientPage(origin: string): Promise<{ page: Page; consoleErrors: string[] }> {
  const opened = await openPage(browser, origin);
  await opened.page.waitForFunction(() => "berthClient" in globalThis);
  return opened;
}

/** The page's globals, as the code evaluated in the page reads them (`globalThis as unknown as PageGlobals`: this file's types are Node's). */
interface PageGlobals {
  berthClient: typeof import("@berth/client/web");
  refusalOf(call: Promise<unknown>): Promise<PageRefusal | undefined>;
  seen: string[];
  stopWatch: AbortController;
  lease: HeldLock;
}

describe("@berth/client in Chromium", () => {
  it("appends, watches live (an append made from Node arrives), and reads a refusal as a BerthClientError", async () => {
    const { page, consoleErrors } = await clientPage(allowedPage.origin);
    try {
      const url = sessions.url("sessions");
      const appended = await page.evaluate(
        async ({ url, token }) => {
          const berth = new (globalThis as unknown as PageGlobals).berthClient.Berth({ sessionsUrl: url, token });
          const { seq, snapshot } = await berth.append("page-session", { type: "generate", pageUrl: "/pricing", count: 3 });
          return { seq: String(seq), phase: snapshot?.phase };
        },
        { url, token: TOKEN },
      );
      expect(appended).toEqual({ seq: "1", phase: "generate_requested" });

      // The watch runs in the page; what it sees is kept on its global `seen`.
      await page.evaluate(
        ({ url, token }) => {
          const page = globalThis as unknown as PageGlobals;
          const berth = new page.berthClient.Berth({ sessionsUrl: url, token });
          page.seen = [];
          page.stopWatch = new AbortController();
          void (async () => {
            try {
              for await (const event of berth.watch("page-session", { includeSnapshot: true, signal: page.stopWatch.signal })) {
                if (event.kind === "entry")
                  page.seen.push(`${event.live ? "live" : "entry"} ${event.entry.seq} ${event.entry.type} ${event.snapshot?.phase ?? ""}`.trim());
                else if (event.kind === "caughtUp") page.seen.push(`caughtUp ${event.lastSeq}`);
              }
            } catch (error) {
              if (!page.stopWatch.signal.aborted) page.seen.push(`failed ${String(error)}`);
            }
          })();
        },
        { url, token: TOKEN },
      );
      await page.waitForFunction(() => (globalThis as unknown as PageGlobals).seen.includes("caughtUp 1"));
      await fromNode.append("page-session", { type: "steer", pageUrl: "/pricing" });
      await page.waitForFunction(() => (globalThis as unknown as PageGlobals).seen.length >= 3);
      expect(await page.evaluate(() => (globalThis as unknown as PageGlobals).seen)).toEqual([
        "entry 1 generate",
        "caughtUp 1",
        "live 2 steer steer_requested",
      ]);
      await page.evaluate(() => (globalThis as unknown as PageGlobals).stopWatch.abort());
      expect(consoleErrors).toEqual([]);

      const refusal = await page.evaluate(
        ({ url, token }) => {
          const page = globalThis as unknown as PageGlobals;
          return page.refusalOf(new page.berthClient.Berth({ sessionsUrl: url, token }).append("page-session", { type: "steer" }, { expectedSeq: 5 }));
        },
        { url, token: TOKEN },
      );
      // The typed detail from the error's body, and its facts from a header CORS lets the page read.
      expect(refusal).toMatchObject({ isBerthClientError: true, code: Code.Aborted, reason: "SEQ_CONFLICT", currentSeq: "2" });
      expect(refusal!.facts).toMatchObject({ reason: "SEQ_CONFLICT", currentSeq: 2 });
      // Chromium logs every answer of an HTTP error status, and a Connect unary refusal is one (ABORTED is 409): that line, and nothing else.
      expect(consoleErrors).toEqual(["Failed to load resource: the server responded with a status of 409 (Conflict)"]);
    } finally {
      await page.close();
    }
  });

  it("holds a lock on a Hold stream (an absolute path), named after its tab; admit is refused, naming Reserve", async () => {
    const { page, consoleErrors } = await clientPage(allowedPage.origin);
    try {
      const file = path.join(makeTempDir("berth-page-lock-"), "app.css");
      const url = sessions.url("sessions");
      const held = await page.evaluate(
        async ({ url, token, file }) => {
          const berth = new (globalThis as unknown as PageGlobals).berthClient.Berth({ sessionsUrl: url, token });
          const lease = await berth.lock(file);
          (globalThis as unknown as PageGlobals).lease = lease;
          return { owner: lease.lease.owner, fencingToken: String(lease.fencingToken) };
        },
        { url, token: TOKEN, file },
      );
      expect(held.owner).toMatch(new RegExp(`^browser (Headless)?Chrome \\d+ tab on ${allowedPage.origin.replace(/[.]/g, "\\.")}$`));
      expect((await fromNode.locks.inspect(file)).holder).toMatchObject({ owner: held.owner, fencingToken: BigInt(held.fencingToken) });
      expect(await page.evaluate(() => (globalThis as unknown as PageGlobals).lease.release())).toBe(true);
      expect((await fromNode.locks.inspect(file)).holder).toBeUndefined();

      const admit = await page.evaluate(() => {
        const page = globalThis as unknown as PageGlobals;
        return page.refusalOf(new page.berthClient.Berth({ budgetUrl: "http://127.0.0.1:9" }).admit([page.berthClient.start("web")], () => undefined));
      });
      expect(admit).toMatchObject({ isBerthClientError: true, code: Code.Unimplemented, reason: "BIDI_STREAM_UNSUPPORTED", metadata: { instead: "Reserve" } });
      expect(consoleErrors).toEqual([]);
    } finally {
      await page.close();
    }
  });

  it("a page on an origin the service does not allow gets FETCH_FAILED naming its origin and the flag, and changes nothing", async () => {
    const { page } = await clientPage(otherPage.origin);
    try {
      const refused = await page.evaluate(
        ({ url, token }) => {
          const page = globalThis as unknown as PageGlobals;
          return page.refusalOf(new page.berthClient.Berth({ sessionsUrl: url, token }).append("from-elsewhere", { type: "steer" }));
        },
        { url: sessions.url("sessions"), token: TOKEN },
      );
      expect(refused).toMatchObject({ isBerthClientError: true, code: Code.Unavailable, reason: "FETCH_FAILED" });
      expect(refused!.message).toContain(`does not allow this page's origin ${otherPage.origin} (start it with --cors-origin ${otherPage.origin}`);
      await expect(fromNode.sessions.snapshot("from-elsewhere")).rejects.toMatchObject({ reason: "SESSION_NOT_FOUND" });
    } finally {
      await page.close();
    }
  });
});
