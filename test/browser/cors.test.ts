// @module-tag chromium
/**
 * CORS as a browser sees it: pages on their own loopback origins (a dev server's) call the sessions
 * service from Chromium with fetch — Connect JSON POST, Connect GET, a server stream, the bearer
 * token — each a real preflight first. The allowed origin reads every answer, refusals included;
 * another origin reads nothing and changes nothing.
 */
import type { Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchChromium, openPage, servePage, type PageServer } from "../harness/browser.js";
import { connectClient, startService, stopAll, type StartedService } from "../harness.js";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";

const TOKEN = "page-token";
const S = "berth.sessions.v1.SessionService";

let browser: Browser;
let allowedPage: PageServer;
let otherPage: PageServer;
let service: StartedService;

beforeAll(async () => {
  [browser, allowedPage, otherPage] = await Promise.all([
    launchChromium(),
    servePage("<!doctype html><title>allowed</title>", "localhost"),
    servePage("<!doctype html><title>other</title>"),
  ]);
  service = await startService("sessions", { args: ["--cors-origin", allowedPage.origin], env: { BERTH_TOKEN: TOKEN } });
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await Promise.all([allowedPage?.close(), otherPage?.close()]);
  await stopAll();
});

/** What a page's fetch came to: the status and body, or the error the browser gave instead (a blocked call). */
type Fetched = { status: number; body: string } | { error: string };

/** Runs fetch(url, init) in the page; headers and body as plain JSON. */
async function fetchIn(pageOrigin: string, url: string, init: { method: string; headers: Record<string, string>; body?: string }): Promise<Fetched> {
  const { page } = await openPage(browser, pageOrigin);
  try {
    return await page.evaluate(
      async ({ url, init }) => {
        try {
          const response = await fetch(url, init);
          return { status: response.status, body: await response.text() };
        } catch (error) {
          return { error: String(error) };
        }
      },
      { url, init },
    );
  } finally {
    await page.close();
  }
}

const json = (token?: string) => ({ "content-type": "application/json", ...(token === undefined ? {} : { authorization: `Bearer ${token}` }) });
const append = (sessionId: string) => JSON.stringify({ sessionId, event: { checkpoint: { reason: "from a page" } } });

describe("CORS in Chromium", () => {
  it("the allowed origin appends (POST), reads (Connect GET) and watches (a server stream), each after a preflight", async () => {
    const url = service.url("sessions");
    const appended = await fetchIn(allowedPage.origin, `${url}/${S}/AppendEvent`, { method: "POST", headers: json(TOKEN), body: append("from-the-page") });
    expect(appended).toMatchObject({ status: 200 });
    expect(JSON.parse((appended as { body: string }).body)).toMatchObject({ seq: "1" });

    const message = encodeURIComponent(JSON.stringify({ sessionId: "from-the-page" }));
    const read = await fetchIn(allowedPage.origin, `${url}/${S}/GetSnapshot?connect=v1&encoding=json&message=${message}`, {
      method: "GET",
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    expect(read).toMatchObject({ status: 200 });
    expect(JSON.parse((read as { body: string }).body)).toMatchObject({ lastSeq: "1" });

    // WatchSession from seq 0: the backlog, then caught-up; the stream is read until that message.
    const { page } = await openPage(browser, allowedPage.origin);
    try {
      const watched = await page.evaluate(
        async ({ url, token }) => {
          const body = new TextEncoder().encode(JSON.stringify({ sessionId: "from-the-page" }));
          const envelope = new Uint8Array(5 + body.length);
          new DataView(envelope.buffer).setUint32(1, body.length);
          envelope.set(body, 5);
          const response = await fetch(`${url}/berth.sessions.v1.SessionService/WatchSession`, {
            method: "POST",
            headers: { "content-type": "application/connect+json", authorization: `Bearer ${token}` },
            body: envelope,
          });
          const reader = response.body!.getReader();
          const decoder = new TextDecoder();
          let text = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            text += decoder.decode(value, { stream: true });
            if (text.includes("caughtUp")) break;
          }
          await reader.cancel();
          return { status: response.status, text };
        },
        { url, token: TOKEN },
      );
      expect(watched.status).toBe(200);
      expect(watched.text).toContain("from a page");
      expect(watched.text).toContain("caughtUp");
    } finally {
      await page.close();
    }
  });

  it("the allowed origin reads a refusal: a call without the token is unauthenticated, not a blocked request", async () => {
    const refused = await fetchIn(allowedPage.origin, `${service.url("sessions")}/${S}/AppendEvent`, {
      method: "POST",
      headers: json(),
      body: append("no-token"),
    });
    expect(refused).toMatchObject({ status: 401 });
    expect(JSON.parse((refused as { body: string }).body)).toMatchObject({ code: "unauthenticated" });
  });

  it("another origin gets nothing, and its call changes nothing", async () => {
    const blocked = await fetchIn(otherPage.origin, `${service.url("sessions")}/${S}/AppendEvent`, {
      method: "POST",
      headers: json(TOKEN),
      body: append("from-elsewhere"),
    });
    expect(blocked).toEqual({ error: "TypeError: Failed to fetch" });
    const client = connectClient(SessionService, service.url("sessions"), { protocol: "connect", token: TOKEN });
    const listed = await client.listSessions({});
    expect(listed.sessions.map((session) => session.id)).not.toContain("from-elsewhere");
  });
});
