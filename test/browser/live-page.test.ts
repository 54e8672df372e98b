// @module-tag chromium
/**
 * The live page in Chromium, served by `berth up --ui` (the budget on a fixture machine, so no
 * verdict depends on this one's load), driven by the `berth` CLI as a person would: each panel
 * shows what a CLI `append`, `lock hold` and `admit` did; the page lives through a restart of the
 * services without a reload; a page on an origin the services do not allow gets nothing; the token
 * comes from the address's fragment or the form; axe-core finds no serious or critical violation;
 * the page works by keyboard; nothing is logged to the console. The README's screenshot is taken
 * here (`BERTH_UPDATE_DOCS=1` writes it to docs/images/), so it shows the page as it is.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import * as path from "node:path";
import { LocksClient, SessionsClient } from "@berth/client";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fixtureArgs } from "../budget-e2e.js";
import { launchChromium, openPage } from "../harness/browser.js";
import { makeTempDir, onStore, repoPath, runCommand, startService, stopAll, type StartedService } from "../harness.js";

const TOKEN = "live-page-token";
const CLI = repoPath("packages/cli/bin/berth.js");
/** Long enough for a loaded machine; the page's own speed is the benchmark's (npm run bench -- ui). */
const SHOWN_MS = 15_000;

let browser: Browser;
let up: StartedService;
let pageUrl: string;
let page: Page;
let consoleErrors: string[];
const spawned: ChildProcess[] = [];
/** How long each panel took to show what a command did, from the command's answer (reported, not asserted). */
const shownAfter: Record<string, number> = {};

/** The services' settings: fixed ports once known, so that a restart comes back where the page looks. */
let upArgs: string[];
const stateDir = path.join(makeTempDir("berth-live-page-"), "state");

async function startUp(args: readonly string[]): Promise<StartedService> {
  const service = await startService("up", { args: [...args], stateDir, env: { BERTH_TOKEN: TOKEN }, ephemeralPorts: false });
  return service;
}

beforeAll(async () => {
  const first = await startService("up", {
    args: ["--ui", "--ui-port", "0", ...fixtureArgs()],
    stateDir,
    env: { BERTH_TOKEN: TOKEN },
  });
  const served = await first.waitForLog((entry) => typeof entry.msg === "string" && entry.msg.startsWith("live page served"));
  pageUrl = String(served.url);
  upArgs = [
    "--ui",
    "--ui-port",
    new URL(pageUrl).port,
    "--sessions-port",
    new URL(first.url("sessions")).port,
    "--budget-port",
    new URL(first.url("budget")).port,
    ...fixtureArgs(),
  ];
  up = first;
  browser = await launchChromium();
  ({ page, consoleErrors } = await openPage(browser, `${pageUrl}#token=${TOKEN}`));
  await page.setViewportSize({ width: 1280, height: 1000 });
  await linkLive("sessions");
  await linkLive("budget");
}, 60_000);

afterAll(async () => {
  for (const child of spawned) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  await browser?.close();
  await stopAll();
  if (Object.keys(shownAfter).length > 0) process.stdout.write(`${JSON.stringify({ test: "live page", shownAfterMs: shownAfter })}\n`);
});

function env(): Record<string, string> {
  return { BERTH_SESSIONS_URL: up.url("sessions"), BERTH_BUDGET_URL: up.url("budget"), BERTH_TOKEN: TOKEN };
}

/** `berth ARGS…` to completion. */
async function berth(args: readonly string[]) {
  const result = await runCommand(process.execPath, [CLI, ...args], { env: env() });
  expect(result.code, `berth ${args.join(" ")}: ${result.stderr}`).toBe(0);
  return result;
}

/** `berth ARGS…` left running (a lock held, an admitted command); resolves once `ready` shows on its stderr or stdout. */
async function berthRunning(args: readonly string[], ready: RegExp): Promise<ChildProcess> {
  const child = spawn(process.execPath, [CLI, ...args], { env: { ...process.env, ...env() }, stdio: ["ignore", "pipe", "pipe"] });
  spawned.push(child);
  let output = "";
  await new Promise<void>((resolve, reject) => {
    const look = (chunk: Buffer) => {
      output += chunk.toString();
      if (ready.test(output)) resolve();
    };
    child.stdout!.on("data", look);
    child.stderr!.on("data", look);
    child.once("exit", (code) => reject(new Error(`berth ${args.join(" ")} exited ${code} before ${ready}: ${output}`)));
  });
  return child;
}

/** Waits until the page shows `text` in `where`; returns how long that took. */
async function shown(where: string, text: string | RegExp): Promise<number> {
  const start = Date.now();
  await page.locator(where).getByText(text).first().waitFor({ timeout: SHOWN_MS });
  return Date.now() - start;
}

async function linkLive(name: string): Promise<void> {
  await page.getByRole("list", { name: "Services" }).getByText(`${name}: live`).waitFor({ timeout: SHOWN_MS });
}

describe("the live page", () => {
  it("takes the token from the address's fragment and takes it out of the address", () => {
    expect(page.url()).not.toContain(TOKEN);
  });

  it("sessions: a CLI append shows in the list; the session's timeline shows each entry and what its snapshot changed", async () => {
    await berth(["sessions", "append", "checkout-flow", "generate", "--field", "pageUrl=/pricing", "--field", "count=3"]);
    shownAfter["sessions list"] = await shown("#sessions", "checkout-flow");
    await page.getByRole("button", { name: /checkout-flow/ }).click();
    const timeline = page.getByRole("region", { name: "Timeline of checkout-flow" });
    await timeline.getByText("#1").waitFor({ timeout: SHOWN_MS });
    await berth(["sessions", "append", "checkout-flow", "steer", "--field", "pageUrl=/pricing"]);
    shownAfter["session timeline"] = await shown("#sessions", "#2");
    await timeline.getByText('phase: "generate_requested" → "steer_requested"').waitFor({ timeout: SHOWN_MS });
    await expect(page.getByRole("button", { name: /checkout-flow/ }).textContent()).resolves.toContain("seq 2 steer");
  });

  it("locks: a CLI lock hold shows its holder and fencing token, a second one waits in order, the grant and release show as they happen", async () => {
    const file = path.join(makeTempDir("berth-live-page-locks-"), "app.ts");
    const first = await berthRunning(["lock", "hold", file, "--owner", "agent one", "--", "sleep", "60"], /acquired/);
    shownAfter["locks holder"] = await shown("#locks table", "agent one");
    const row = page.locator("#locks tbody tr", { hasText: file });
    await expect(row.locator("td").nth(1).textContent()).resolves.toBe("1");
    await berthRunning(["lock", "hold", file, "--owner", "agent two", "--", "sleep", "60"], /waiting/);
    await row.locator(".waiters").getByText("agent two").waitFor({ timeout: SHOWN_MS });
    first.kill("SIGTERM");
    await page.locator("#locks .log").getByText(`${file}: agent two granted (token 2)`).waitFor({ timeout: SHOWN_MS });
    await page.locator("#locks .log").getByText(`${file}: agent one released (token 1)`).waitFor({ timeout: SHOWN_MS });
    await expect(row.locator("td").nth(0).textContent()).resolves.toBe("agent two");
  });

  it("locks: a lease that runs out unrenewed shows its countdown, then its expiry as it happens", async () => {
    const file = path.join(makeTempDir("berth-live-page-lease-"), "lease.ts");
    const locks = new LocksClient({ url: up.url("sessions"), token: TOKEN });
    const lease = await locks.acquire(file, { owner: "forgetful agent", ttlMs: 2000 });
    const row = page.locator("#locks tbody tr", { hasText: file });
    await row.getByText(/\d+ (ms|s) left/).waitFor({ timeout: SHOWN_MS });
    await page.locator("#locks .log").getByText(`${file}: forgetful agent expired (token ${lease.fencingToken})`).waitFor({ timeout: SHOWN_MS });
    await row.waitFor({ state: "detached", timeout: SHOWN_MS });
  });

  it("budget: a CLI admit shows its reservation and running work; one that waits shows its place, ETA and reason", async () => {
    // The budget is 4G on the fixture machine: a 3G admission fits, a second one waits for it.
    await berthRunning(["admit", "--memory", "3G", "--owner", "big build", "--json", "--", "sleep", "60"], /"event":"started"/);
    shownAfter["budget reservation"] = await shown("#budget", "big build");
    await page.locator("#budget table", { hasText: "sleep" }).waitFor({ timeout: SHOWN_MS });
    await berthRunning(["admit", "--memory", "3G", "--owner", "second build", "--json", "--", "true"], /"event":"queued"/);
    const queue = page.getByRole("list", { name: "Queue, in order" });
    shownAfter["budget queue"] = await shown("#budget", "second build");
    const entry = queue.getByRole("listitem").filter({ hasText: "second build" });
    await expect(entry.locator(".position").textContent()).resolves.toBe("#1");
    await entry.getByText(/memory/).waitFor({ timeout: SHOWN_MS });
    await entry.getByText(/^ETA \d/).waitFor({ timeout: SHOWN_MS });
  });

  it("draws the machine's memory and cpu as charts, with the figures in words", async () => {
    await page
      .locator("#budget .figures")
      .getByText(/GiB of 16\.0 GiB/)
      .waitFor({ timeout: SHOWN_MS });
    await expect(page.locator("#budget canvas").count()).resolves.toBe(2);
  });

  it("axe-core finds no serious or critical accessibility violation", async () => {
    const axeSource = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
    // Evaluated, not added as a script: the page's CSP refuses inline scripts, as it should.
    await page.evaluate(axeSource);
    const violations = await page.evaluate(async () => {
      const axe = (globalThis as unknown as { axe: { run(): Promise<{ violations: { id: string; impact: string; help: string; nodes: unknown[] }[] }> } }).axe;
      const result = await axe.run();
      return result.violations.map(({ id, impact, help, nodes }) => ({ id, impact, help, nodes: nodes.length }));
    });
    expect(violations.filter((violation) => violation.impact === "serious" || violation.impact === "critical")).toEqual([]);
  });

  it("works by keyboard: the skip link, a session opened and closed with Enter", async () => {
    // A click on the header, as a person starting over would: the next Tab starts from there.
    await page.mouse.click(1, 1);
    await page.keyboard.press("Tab");
    await expect(page.evaluate("document.activeElement?.textContent")).resolves.toBe("Skip to the sessions");
    const sessionButton = page.getByRole("button", { name: /checkout-flow/ });
    for (let presses = 0; presses < 30 && !(await sessionButton.evaluate((element) => element === element.ownerDocument.activeElement)); presses++) {
      await page.keyboard.press("Tab");
    }
    await expect(sessionButton.evaluate((element) => element === element.ownerDocument.activeElement)).resolves.toBe(true);
    await page.keyboard.press("Enter");
    await expect(sessionButton.getAttribute("aria-pressed")).resolves.toBe("false");
    await page.keyboard.press("Enter");
    await page.getByRole("region", { name: "Timeline of checkout-flow" }).waitFor({ timeout: SHOWN_MS });
  });

  it("produces the README's screenshot", async () => {
    const target = process.env["BERTH_UPDATE_DOCS"] === "1" ? repoPath("docs/images/live-page.png") : path.join(makeTempDir("berth-shot-"), "live-page.png");
    const image = await page.screenshot({ path: target, fullPage: true });
    expect(image.length).toBeGreaterThan(10_000);
  });

  it("lives through a restart of the services without a reload: it reconnects and shows what comes next", async () => {
    await page.evaluate(() => Object.assign(globalThis, { beforeRestart: true }));
    for (const child of spawned) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await up.stop();
    await page
      .getByRole("list", { name: "Services" })
      .getByText(/sessions: (reconnecting|connecting)/)
      .waitFor({ timeout: SHOWN_MS });
    up = await startUp(upArgs);
    await linkLive("sessions");
    await berth(["sessions", "append", "after-restart", "generate", "--field", "pageUrl=/"]);
    await shown("#sessions", "after-restart");
    await expect(page.evaluate(() => (globalThis as { beforeRestart?: boolean }).beforeRestart)).resolves.toBe(true);
  });

  it("logs nothing to the console but the refused connections of the restart", () => {
    // Chromium reports each fetch that found nothing listening while the services were down.
    expect(consoleErrors.filter((line) => !line.includes("net::ERR_CONNECTION_REFUSED"))).toEqual([]);
  });
});

describe("the page's token and origin", () => {
  it("asks for the token when it has none, and goes live once it is typed", async () => {
    const { page: bare, consoleErrors: errors } = await openPage(browser, pageUrl);
    try {
      await bare.getByRole("form", { name: "Token" }).waitFor({ timeout: SHOWN_MS });
      await bare.getByRole("textbox", { name: "Token" }).fill(TOKEN);
      await bare.keyboard.press("Enter");
      await bare.getByRole("list", { name: "Services" }).getByText("sessions: live").waitFor({ timeout: SHOWN_MS });
      await bare.locator("#sessions").getByText("after-restart").waitFor({ timeout: SHOWN_MS });
      // A refused call (401) is logged by Chromium as a failed resource; the page itself logs nothing.
      expect(errors.filter((line) => !line.includes("status of 401"))).toEqual([]);
    } finally {
      await bare.close();
    }
  });

  it("berth ui on an origin the services do not allow: the command says so, and the page gets no data", async () => {
    const ui = spawn(process.execPath, [CLI, "ui", "--ui-port", "0"], { env: { ...process.env, ...env() }, stdio: ["ignore", "pipe", "pipe"] });
    spawned.push(ui);
    let stdout = "";
    let stderr = "";
    ui.stdout!.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    ui.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const deadline = Date.now() + SHOWN_MS;
    while (!/does not allow the page's origin[\s\S]*does not allow/.test(stderr) && Date.now() < deadline)
      await new Promise((resolve) => setTimeout(resolve, 50));
    expect(stderr).toMatch(
      /sessions at http:\/\/127\.0\.0\.1:\d+: does not allow the page's origin: start it with --cors-origin http:\/\/127\.0\.0\.1:\d+,http:\/\/localhost:\d+/,
    );
    expect(stderr).toMatch(/budget at http:\/\/127\.0\.0\.1:\d+: does not allow the page's origin/);
    const address = /the live page is at (\S+)/.exec(stdout)?.[1];
    expect(address).toBeDefined();
    const { page: refused } = await openPage(browser, `${address}#token=${TOKEN}`);
    try {
      await refused
        .getByRole("list", { name: "Services" })
        .getByText(/sessions: reconnecting: .*--cors-origin/)
        .waitFor({ timeout: SHOWN_MS });
      await expect(refused.locator("#sessions").textContent()).resolves.toContain("No session yet");
    } finally {
      await refused.close();
      ui.kill("SIGTERM");
    }
  });
});

describe("on etcd", { tags: ["etcd"] }, () => {
  // One fleet: both instances under one prefix (each test service gets a prefix of its own otherwise).
  const FLEET_PREFIX = `live-page-${process.pid}/`;
  it("shows every budget instance of the fleet, and the sessions the cluster keeps", async () => {
    const upOnEtcd = await startService(
      "up",
      await onStore("etcd", { args: ["--ui", "--ui-port", "0", "--machine-name", "box-one", "--etcd-prefix", FLEET_PREFIX, ...fixtureArgs()] }),
    );
    const served = await upOnEtcd.waitForLog((entry) => typeof entry.msg === "string" && entry.msg.startsWith("live page served"));
    await startService("budget", await onStore("etcd", { args: ["--machine-name", "box-two", "--etcd-prefix", FLEET_PREFIX, ...fixtureArgs()] }));
    const sessions = new SessionsClient({ url: upOnEtcd.url("sessions") });
    await sessions.append("on-etcd", { type: "generate", pageUrl: "/" });
    const { page: fleetPage, consoleErrors: errors } = await openPage(browser, String(served.url));
    try {
      const fleet = fleetPage.locator("#fleet table");
      await fleet.getByText("box-one").waitFor({ timeout: SHOWN_MS });
      await fleet.getByText("box-two").waitFor({ timeout: SHOWN_MS });
      await fleetPage.locator("#sessions").getByText("on-etcd").waitFor({ timeout: SHOWN_MS });
      expect(errors).toEqual([]);
    } finally {
      await fleetPage.close();
    }
  });
});
