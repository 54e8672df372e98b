// @module-tag chromium
/**
 * examples/browser in Chromium, served by its own script (`npm run example:browser`, here on a free
 * port) and calling a sessions service that allows the script's origin, as its README says. The
 * page shows live what the agent appends from Node; its checkpoint, whose answer is lost and whose
 * click is retried, is written once; after a reload it watches from the seq after the last it
 * rendered and shows each entry once; after the service restarts on the same port it watches again
 * by itself and shows what comes next. It logs no console error but the browser's own lines for
 * the calls that failed on the way.
 */
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fromBinary } from "@bufbuild/protobuf";
import { WatchSessionRequestSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { Berth } from "@berth/client";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchChromium, openPage } from "../harness/browser.js";
import { onStopAll, repoPath, startService, stopAll, type StartedService } from "../harness.js";

const TOKEN = "example-token";

let browser: Browser;
/** The example's origin, as its script printed it. */
let origin: string;
let sessions: StartedService;
let fromNode: Berth;

beforeAll(async () => {
  [browser, origin] = await Promise.all([launchChromium(), serveExample()]);
  sessions = await startSessions();
  fromNode = new Berth({ sessionsUrl: sessions.url("sessions"), token: TOKEN, env: {} });
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await stopAll();
});

/** Runs examples/browser's serve script on a free port; resolves with the origin it prints. Killed by stopAll. */
async function serveExample(): Promise<string> {
  const child = spawn(process.execPath, [repoPath("examples/browser/dist/serve.js"), "--port", "0"], { stdio: ["ignore", "pipe", "pipe"] });
  let running = true;
  onStopAll(() => {
    if (running) child.kill("SIGKILL");
  });
  let stderr = "";
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
  return new Promise((resolve, reject) => {
    child.once("close", (code) => {
      running = false;
      reject(new Error(`examples/browser/dist/serve.js exited (${code}) before it served: ${stderr}`));
    });
    createInterface({ input: child.stdout }).on("line", (line) => {
      const served = /^examples\/browser: (http:\/\/127\.0\.0\.1:\d+)\/\?session=demo$/.exec(line);
      if (served) resolve(served[1]!);
    });
  });
}

/** The sessions service allowing the example's origin (again on `port`, with `stateDir`, for a restart). */
function startSessions(restart?: { port: string; stateDir: string }): Promise<StartedService> {
  return startService("sessions", {
    ...(restart === undefined ? {} : { stateDir: restart.stateDir }),
    args: ["--cors-origin", origin, ...(restart === undefined ? [] : ["--sessions-port", restart.port])],
    env: { BERTH_TOKEN: TOKEN },
  });
}

/** The example opened on `sessionId`, the token in the fragment; the `fromSeq` of each WatchSession it sends; its console errors. */
async function openExample(sessionId: string): Promise<{ page: Page; watchedFrom: bigint[]; consoleErrors: string[] }> {
  const query = new URLSearchParams({ session: sessionId, sessions: sessions.url("sessions") });
  // Blank first, so that the listener below sees the watch the page opens as it loads.
  const { page, consoleErrors } = await openPage(browser, "about:blank");
  const watchedFrom: bigint[] = [];
  page.on("request", (request) => {
    if (!request.url().endsWith("/berth.sessions.v1.SessionService/WatchSession")) return;
    // A Connect stream's request: one enveloped message (a flags byte, a 4-byte length), binary.
    const body = request.postDataBuffer();
    if (body !== null) watchedFrom.push(fromBinary(WatchSessionRequestSchema, body.subarray(5)).fromSeq);
  });
  await page.goto(`${origin}/?${query}#token=${TOKEN}`);
  await live(page);
  return { page, watchedFrom, consoleErrors };
}

/** Waits until the page says it is watching live. */
function live(page: Page): Promise<void> {
  return page.locator('#connection[data-state="live"]').waitFor();
}

/** The journal lines the page shows, once it shows the line of `seq`. */
async function logOnceAt(page: Page, seq: number): Promise<string[]> {
  await page.locator(`#log li[data-seq="${seq}"]`).waitFor();
  return page.locator("#log li").allTextContents();
}

/** What the page says once the service confirmed the checkpoint just sent. */
async function checkpointSaved(page: Page): Promise<string | null> {
  const status = page.locator("#checkpoint-status");
  await page.locator("#checkpoint-status:not(:text('sending'))").waitFor();
  return status.textContent();
}

describe("examples/browser in Chromium", () => {
  it("shows live what the agent publishes: its phase, its variants, its error", async () => {
    const { page, consoleErrors } = await openExample("agent-live");
    try {
      expect(await page.locator("#connection").textContent()).toBe("live: watching agent-live from seq 1, caught up at seq 0");
      // The token, read from the fragment, is kept for the tab and taken out of the address.
      expect(new URL(page.url()).hash).toBe("");
      await fromNode.append("agent-live", { type: "generate", pageUrl: "/pricing", count: 3 });
      await fromNode.append("agent-live", { type: "agent_phase", phase: "generating", durationMs: 12 });
      expect(await logOnceAt(page, 2)).toEqual(["#1 generate", "#2 agent: generating (12 ms)"]);
      expect(await page.locator("#phase").textContent()).toBe("phase generate_requested, agent generating, variants 0 of 3");

      await fromNode.append("agent-live", { type: "agent_done", arrivedVariants: 3, previewFile: "pricing.preview.html" });
      expect(await logOnceAt(page, 3)).toContain("#3 agent done: 3 variants in pricing.preview.html");
      expect(await page.locator("#variants button").allTextContents()).toEqual([
        "Variant 1 of pricing.preview.html",
        "Variant 2 of pricing.preview.html",
        "Variant 3 of pricing.preview.html",
      ]);

      await fromNode.append("agent-live", { type: "agent_error", message: "the build broke" });
      await page.locator("#agent-error:visible").waitFor();
      expect(await page.locator("#agent-error").textContent()).toBe("agent error: the build broke");
      expect(await logOnceAt(page, 4)).toContain("#4 agent error: the build broke");
      expect(consoleErrors).toEqual([]);
    } finally {
      await page.close();
    }
  });

  it("sends a checkpoint of what it shows; one whose answer was lost, sent again by a click, is written once", async () => {
    await fromNode.append("checkpoints", { type: "agent_done", arrivedVariants: 2 });
    const { page, consoleErrors } = await openExample("checkpoints");
    try {
      // The first checkpoint reaches the service, and its answer is lost on the way back.
      await page.route("**/berth.sessions.v1.SessionService/AppendEvent", async (route) => {
        await route.fetch();
        await route.abort("connectionreset");
      });
      await page.getByRole("button", { name: "Variant 2" }).click();
      await page.getByText(/^checkpoint 1 not confirmed/).waitFor();
      await page.unroute("**/berth.sessions.v1.SessionService/AppendEvent");

      await page.getByRole("button", { name: "Send checkpoint" }).click();
      expect(await checkpointSaved(page)).toBe("checkpoint 1 saved as #2 (a repeat: saved once)");

      const checkpoints = [];
      for await (const entry of fromNode.sessions.journal("checkpoints")) if (entry.type === "checkpoint") checkpoints.push(entry);
      expect(checkpoints).toHaveLength(1);
      expect(checkpoints[0]!.seq).toBe(2n);
      const { snapshot } = await fromNode.sessions.snapshot("checkpoints");
      expect(snapshot).toMatchObject({ browserCheckpointRevision: 1n, visibleVariant: 2, phase: "variants_ready" });
      expect(snapshot?.activeOwner).toMatch(/^browser HeadlessChrome \d+ tab on http:\/\/127\.0\.0\.1:\d+ #[0-9a-f]{8}$/);
      expect(await logOnceAt(page, 2)).toEqual(["#1 agent done: 2 variants", expect.stringMatching(/^#2 checkpoint 1: variant 2 shown by browser /)]);

      // The next one is a new checkpoint, one revision on.
      await page.getByRole("button", { name: "Send checkpoint" }).click();
      expect(await checkpointSaved(page)).toBe("checkpoint 2 saved as #3");
      // The only console line is the browser's, for the answer the route cut.
      expect(consoleErrors).toEqual(["Failed to load resource: net::ERR_CONNECTION_RESET"]);
    } finally {
      await page.close();
    }
  });

  it("after a reload, watches from the seq after the last it rendered and shows each entry once", async () => {
    for (const phase of ["planning", "generating", "checking"]) await fromNode.append("reloads", { type: "agent_phase", phase });
    const { page, watchedFrom, consoleErrors } = await openExample("reloads");
    try {
      const before = await logOnceAt(page, 3);
      expect(before).toEqual(["#1 agent: planning", "#2 agent: generating", "#3 agent: checking"]);
      expect(watchedFrom).toEqual([1n]);

      await page.reload();
      await live(page);
      expect(watchedFrom).toEqual([1n, 4n]);
      expect(await page.locator("#connection").textContent()).toBe("live: watching reloads from seq 4, caught up at seq 3");
      expect(await page.locator("#log li").allTextContents()).toEqual(before);
      expect(await page.locator("#phase").textContent()).toBe("phase new, agent checking, variants 0");

      await fromNode.append("reloads", { type: "agent_done", arrivedVariants: 1 });
      expect(await logOnceAt(page, 4)).toEqual([...before, "#4 agent done: 1 variants"]);
      expect(consoleErrors).toEqual([]);
    } finally {
      await page.close();
    }
  });

  it("after the service restarts on the same port, watches again by itself and shows what comes next", async () => {
    await fromNode.append("restarts", { type: "agent_phase", phase: "planning" });
    const { page, watchedFrom, consoleErrors } = await openExample("restarts");
    try {
      expect(await logOnceAt(page, 1)).toEqual(["#1 agent: planning"]);
      await page.evaluate(() => Object.assign(globalThis, { sameDocument: true }));

      const port = new URL(sessions.url("sessions")).port;
      await sessions.stop();
      await page.locator('#connection[data-state="reconnecting"]').waitFor();
      sessions = await startSessions({ port, stateDir: sessions.stateDir });
      await live(page);

      await fromNode.append("restarts", { type: "agent_phase", phase: "generating" });
      expect(await logOnceAt(page, 2)).toEqual(["#1 agent: planning", "#2 agent: generating"]);
      expect(await page.evaluate(() => "sameDocument" in globalThis)).toBe(true);
      // Every watch after the first asked for the seq after #1: nothing was sent twice.
      expect(watchedFrom[0]).toBe(1n);
      expect(new Set(watchedFrom.slice(1))).toEqual(new Set([2n]));
      // While the service was away, each attempt failed on the way: the browser logs those, the page nothing.
      expect(consoleErrors.filter((line) => line !== "Failed to load resource: net::ERR_CONNECTION_REFUSED")).toEqual([]);
    } finally {
      await page.close();
    }
  });
});
