/**
 * The live page with a busy box, in Chromium (Debian's, driven by playwright-core; `BERTH_CHROMIUM`
 * names another build): `berth up --ui` on a fixture machine holding `--sessions` sessions (1,000)
 * and `--queued` budget requests waiting (10,000), then `--rate` appends a second (100) for
 * `--seconds` (20). One JSON line per figure, each with its target and a reference from the same
 * run (the machine is shared: read a figure against its reference):
 *
 * - `assets`: index.html, page.js and page.css gzipped at level 9 (target ≤ 250 KB in all);
 * - `initial load`: navigation start to the page showing both counts in the panel headings (the
 *   sessions and the queue) with its sessions and budget watches live, the median of `--loads`
 *   loads, each in a fresh browser context (target ≤ 1 s), with when the page first rendered and
 *   when each of the two was live, the page's main-thread task time and the services' CPU until
 *   then. References: the same page loaded the same way on the same services while they were
 *   empty; and the two watches' description of the current state read from Node at once, over the
 *   page's protocol (what the page waits for, without the page);
 * - `main thread busy`: the page's main-thread task time (CDP `Performance.getMetrics`,
 *   TaskDuration) over the steady phase's wall time (target < 50 %), with its script, layout and
 *   style parts, the services' and this process's CPU over the same time. Reference: the same
 *   page over 5 s with no event coming;
 * - `update on screen`: from an append's answer (Node, `Date.now()`) to the moment the page's DOM
 *   shows that session's new seq (a MutationObserver in the page, `Date.now()`), p50 and p99 over
 *   every append of the steady phase (target p99 ≤ 250 ms). The page renders in an animation
 *   frame, so a row in the DOM then is painted in that frame. Also from the append's sending (an
 *   upper bound: it holds the append's own round trip). Reference: the appends' round trip. The
 *   list shows the latest changes first, its top rows drawn: an update that more than a screenful
 *   of newer ones pushed down before the next render (a burst after the services stalled) never
 *   reaches the screen: it is counted as not shown, and ranks after every shown one in the
 *   percentiles (a percentile that falls on one is null).
 *
 * The services run with `--fsync=none`: with `batch` an append is answered after the disk's
 * fdatasync, hundreds of ms on a shared disk, while its change is already on its way to watchers,
 * so the figure from the answer would say the disk's time, negatively. The queue is one
 * reservation that fills the budget (a lease of an hour) and `--queued` Reserve calls that wait
 * behind it, spread over `--connections` HTTP/2 connections (the services allow 10,000 concurrent
 * streams on one): a waiting unary call costs neither side anything more. The appends go over one
 * HTTP/2 connection, open loop (one every 1/rate s whatever the answers). Everything runs on
 * loopback and ends by itself; every process started here is stopped.
 *
 * `npm run bench -- ui [--sessions=1000] [--queued=10000] [--rate=100] [--seconds=20] [--loads=3]
 * [--connections=4] [--profile=FILE]`: with `--profile`, the page's JavaScript during the first
 * busy load is written to FILE as a CPU profile (`.cpuprofile`, for Chromium's DevTools), whose
 * functions read best from an unminified build (`BERTH_PAGE_MINIFY=0 npm run build`).
 */
import { setMaxListeners } from "node:events";
import { gzipSync } from "node:zlib";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetClient, createTransport, SessionsClient } from "@berth/client";
import { chromium, type Browser, type Page } from "playwright-core";
import { fixtureMachine } from "../lib/fixture-machine.js";
import { emit, percentiles, ratio } from "../lib/report.js";
import { startBerthUp, type BerthUp } from "../lib/server.js";

const PAGE_DIR = fileURLToPath(new URL("../../../packages/ui/dist/page/", import.meta.url));
const GiB = 1024 ** 3;
/** How long the page may take to show a state before the run gives up (a bound, not a figure). */
const SHOWN_TIMEOUT_MS = 60_000;
/** What the page's observer logs once it shows what a load waits for. */
const SHOWN_MESSAGE = "berth-bench: shown";
/** How long after the last append the page may take to show the ones it has not shown yet. */
const SETTLE_MS = 3000;
/** How long the page's idle main thread is measured before the events start (the reference of the busy share). */
const IDLE_MS = 5000;

interface Settings {
  profile?: string | undefined;
  sessions: number;
  queued: number;
  rate: number;
  seconds: number;
  loads: number;
  connections: number;
}

/** Runs the suite. */
export async function run(args: string[] = []): Promise<void> {
  const settings: Settings = { sessions: 1000, queued: 10_000, rate: 100, seconds: 20, loads: 3, connections: 4 };
  for (const arg of args) {
    const [name, value] = arg.replace(/^--/, "").split("=", 2) as [string, string | undefined];
    if (name === "profile" && value) {
      settings.profile = value;
      continue;
    }
    const number = Number(value);
    if (name in settings && name !== "profile" && Number.isInteger(number) && number > 0) settings[name as Exclude<keyof Settings, "profile">] = number;
    else throw new Error(`unknown flag ${arg}; flags: --sessions=N --queued=N --rate=N --seconds=N --loads=N --connections=N --profile=FILE`);
  }
  weighAssets();

  const machine = fixtureMachine();
  const waiting = new AbortController();
  let up: BerthUp | undefined;
  let browser: Browser | undefined;
  const stop = async () => {
    waiting.abort();
    await browser?.close();
    await up?.stop();
    rmSync(machine.dir, { recursive: true, force: true });
  };
  const onSignal = () => void stop().finally(() => process.exit(130));
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    up = await startBerthUp([...machine.args, `--max-queue=${settings.queued + 1}`, "--fsync=none"]);
    browser = await chromium.launch({ executablePath: process.env["BERTH_CHROMIUM"] ?? "/usr/bin/chromium", args: ["--no-sandbox"] });

    const empty = await loads(browser, up, { sessions: 0, queued: 0 }, settings.loads);
    await empty.page.close();
    const sessions = new SessionsClient({ transport: createTransport({ url: up.sessionsUrl }, { protocol: "grpc" }) });
    const ids = await fillSessions(sessions, settings.sessions);
    await fillQueue(up, settings, waiting.signal);
    const describedFromNode = await describeFromNode(up);
    const busy = await loads(browser, up, { sessions: settings.sessions, queued: settings.queued }, settings.loads, settings.profile);
    const shown = median(busy.loads.map((load) => load.shownMs));
    const emptyShown = median(empty.loads.map((load) => load.shownMs));
    emit({
      suite: "ui",
      figure: "initial load",
      sessions: settings.sessions,
      queued: settings.queued,
      loads_ms: busy.loads.map((load) => load.shownMs),
      median_ms: shown,
      app_rendered_ms: median(busy.loads.map((load) => load.appRenderedMs)),
      sessions_live_ms: median(busy.loads.map((load) => load.sessionsLiveMs)),
      budget_live_ms: median(busy.loads.map((load) => load.budgetLiveMs)),
      page_main_thread_ms: median(busy.loads.map((load) => load.pageBusyMs)),
      services_cpu_ms: median(busy.loads.map((load) => load.servicesCpuMs)),
      current_state_from_node_ms: describedFromNode,
      empty_box_median_ms: emptyShown,
      empty_box_page_main_thread_ms: median(empty.loads.map((load) => load.pageBusyMs)),
      ratio: ratio(shown, emptyShown),
      target_ms: 1000,
      met: shown <= 1000,
    });
    await steadyPhase(busy.page, sessions, ids, up, settings);
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    await stop();
  }
}

/** The page's three files, gzipped as a server or a CDN would at its best (level 9). */
function weighAssets(): void {
  const files: Record<string, { bytes: number; gzip_bytes: number }> = {};
  let total = 0;
  for (const name of ["index.html", "page.js", "page.css"]) {
    const body = readFileSync(`${PAGE_DIR}${name}`);
    const gzipped = gzipSync(body, { level: 9 }).length;
    files[name] = { bytes: body.length, gzip_bytes: gzipped };
    total += gzipped;
  }
  emit({ suite: "ui", figure: "assets", files, gzip_bytes: total, target_bytes: 250_000, met: total <= 250_000 });
}

/** What the page must show to count as loaded: both counts, and its sessions and budget watches live. */
interface Expected {
  readonly sessions: number;
  readonly queued: number;
}

/** One load of the page: until it showed what was expected, the page's main-thread task time, and the services' CPU. */
interface Load {
  readonly shownMs: number;
  /** The page's first render (its panels in the DOM). */
  readonly appRenderedMs: number;
  readonly sessionsLiveMs: number;
  readonly budgetLiveMs: number;
  readonly pageBusyMs: number;
  readonly servicesCpuMs: number;
}

/**
 * Loads the page `times` times, each in a fresh context (no cache), and answers the time from
 * navigation start to it showing `expected`, measured in the page by a MutationObserver installed
 * before any of the page's scripts; the last page is left open.
 */
async function loads(browser: Browser, up: BerthUp, expected: Expected, times: number, profile?: string): Promise<{ loads: Load[]; page: Page }> {
  const measured: Load[] = [];
  let page: Page | undefined;
  for (let i = 0; i < times; i++) {
    await page?.close();
    page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
    await page.addInitScript(
      (want: Expected & { readonly shownMessage: string }) => {
        const marks: Record<string, number> = {};
        Object.assign(globalThis, { berthBenchMarks: marks });
        const mark = (name: string, reached: boolean) => {
          if (reached && marks[name] === undefined) marks[name] = performance.now();
        };
        const observer = new MutationObserver(() => {
          const sessions = document.querySelector("#sessions-title .count")?.textContent;
          const queueHeading = [...document.querySelectorAll("#budget h3")].find((heading) => heading.textContent?.startsWith("Queue"));
          const queued = queueHeading?.querySelector(".count")?.textContent;
          const links = document.querySelector("ul.links")?.textContent ?? "";
          mark("app", sessions !== undefined);
          mark("sessionsLive", sessions === String(want.sessions) && links.includes("sessions: live"));
          mark("budgetLive", queued === String(want.queued) && links.includes("budget: live"));
          if (marks["sessionsLive"] === undefined || marks["budgetLive"] === undefined) return;
          marks["shown"] = performance.now();
          observer.disconnect();
          console.debug(want.shownMessage);
        });
        observer.observe(document, { childList: true, subtree: true, characterData: true });
      },
      { ...expected, shownMessage: SHOWN_MESSAGE },
    );
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Performance.enable");
    const profiled = profile !== undefined && i === 0;
    if (profiled) {
      await cdp.send("Profiler.enable");
      await cdp.send("Profiler.setSamplingInterval", { interval: 200 });
      await cdp.send("Profiler.start");
    }
    // Told by a console message, not polled with waitForFunction: that would evaluate Playwright's
    // own script in the page during the load (70-130 ms of its main thread in a trace).
    const shown = page.waitForEvent("console", { predicate: (message) => message.text() === SHOWN_MESSAGE, timeout: SHOWN_TIMEOUT_MS });
    const cpuBefore = up.cpuMs();
    await page.goto(up.pageUrl);
    await shown;
    const servicesCpuMs = up.cpuMs() - cpuBefore;
    const metrics = metricsOf(await cdp.send("Performance.getMetrics"));
    if (profiled) writeFileSync(profile, JSON.stringify((await cdp.send("Profiler.stop")).profile));
    await cdp.detach();
    const marks = await page.evaluate(() => (globalThis as unknown as { berthBenchMarks: Record<string, number> }).berthBenchMarks);

    measured.push({
      shownMs: round1(marks["shown"]!),
      appRenderedMs: round1(marks["app"]!),
      sessionsLiveMs: round1(marks["sessionsLive"]!),
      budgetLiveMs: round1(marks["budgetLive"]!),
      pageBusyMs: round1((metrics["TaskDuration"] ?? NaN) * 1000),
      servicesCpuMs,
    });
  }
  return { loads: measured, page: page! };
}

/**
 * What the page waits for, without the page: the time from Node to the end of each watch's
 * description of the current state (caughtUp), the sessions' and the budget's at once as the page
 * opens them, over the page's protocol (Connect, binary, HTTP/1.1).
 */
async function describeFromNode(up: BerthUp): Promise<{ sessions: number; budget: number }> {
  const sessions = new SessionsClient({ transport: createTransport({ url: up.sessionsUrl }) });
  const budget = new BudgetClient({ transport: createTransport({ url: up.budgetUrl }) });
  const untilCaughtUp = async (events: AsyncIterable<{ readonly kind: string }>) => {
    const start = performance.now();
    for await (const event of events) if (event.kind === "caughtUp") break;
    return round1(performance.now() - start);
  };
  const [sessionsMs, budgetMs] = await Promise.all([
    untilCaughtUp(sessions.watchSessions({ includeCurrent: true, includeCompleted: true, includeSnapshot: true })),
    untilCaughtUp(budget.watchBudget({ includeCurrent: true })),
  ]);
  return { sessions: sessionsMs, budget: budgetMs };
}

/** Creates `count` sessions, one append each, 32 at a time; answers their ids, oldest first. */
async function fillSessions(sessions: SessionsClient, count: number): Promise<string[]> {
  const ids = Array.from({ length: count }, (_, i) => `bench-${String(i).padStart(5, "0")}`);
  let next = 0;
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (next < ids.length) {
        const id = ids[next++]!;
        await sessions.append(id, { type: "generate", pageUrl: `/page/${id}`, count: 3 });
      }
    }),
  );
  return ids;
}

/** One reservation takes the whole budget; `queued` Reserve calls then wait behind it until `signal` aborts. */
async function fillQueue(up: BerthUp, settings: Settings, signal: AbortSignal): Promise<void> {
  const clients = Array.from(
    { length: settings.connections },
    () => new BudgetClient({ transport: createTransport({ url: up.budgetUrl }, { protocol: "grpc" }) }),
  );
  const need = (memoryBytes: number) => ({
    items: [{ kind: NeedItemKind.START, name: "web", costSource: { case: "cost" as const, value: { memoryBytes: BigInt(memoryBytes), cpu: 0.5 } } }],
  });
  const refused: unknown[] = [];
  // Every waiting call listens to the one signal that ends them all.
  setMaxListeners(settings.queued + 1, signal);
  await clients[0]!.reserve(need(4 * GiB), { owner: "bench: the whole budget", ttlMs: 3_600_000, skipLoadGate: true });
  for (let i = 0; i < settings.queued; i++) {
    clients[i % clients.length]!.reserve(need(GiB), { owner: `bench build ${i}`, maxWaitMs: 600_000, skipLoadGate: true, signal }).catch((error: unknown) => {
      // Cancelled at the end of the run, as intended; anything before is a failure of the run.
      if (!signal.aborted) refused.push(error);
    });
  }
  const deadline = Date.now() + SHOWN_TIMEOUT_MS * 2;
  for (;;) {
    const state = await clients[0]!.rpc.getState({ pageSize: 1 });
    if (state.queueSize >= settings.queued) return;
    if (refused.length > 0) throw new Error(`${refused.length} of ${settings.queued} Reserve calls were refused, the first: ${String(refused[0])}`);
    if (Date.now() > deadline) throw new Error(`only ${state.queueSize} of ${settings.queued} requests queued`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/**
 * `rate` appends a second for `seconds`, over the sessions in turn from the oldest (each moves its
 * row to the top of the list), while the page's main thread is measured and a MutationObserver in
 * the page notes when each session's new seq appears.
 */
async function steadyPhase(page: Page, sessions: SessionsClient, ids: readonly string[], up: BerthUp, settings: Settings): Promise<void> {
  await page.evaluate(() => {
    const seen = new Map<string, number>();
    const list = document.querySelector("#sessions")!;
    const look = () => {
      const now = Date.now();
      for (const row of list.querySelectorAll(".session-row")) {
        const key = `${row.querySelector(".id")?.textContent} ${row.querySelector(".seq")?.textContent?.split(" ")[1]}`;
        if (!seen.has(key)) seen.set(key, now);
      }
    };
    new MutationObserver(look).observe(list, { childList: true, subtree: true, characterData: true });
    Object.assign(globalThis, { berthBenchSeen: seen });
  });
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Performance.enable");
  // The reference: the same page on the same box with no event coming (its clocks, the machine's samples).
  const idleBefore = metricsOf(await cdp.send("Performance.getMetrics"));
  await new Promise((resolve) => setTimeout(resolve, IDLE_MS));
  const before = metricsOf(await cdp.send("Performance.getMetrics"));
  const idleShare = shareOf(idleBefore, before, "TaskDuration");
  const cpuBefore = up.cpuMs();
  const clientCpuBefore = process.cpuUsage();

  const answered = new Map<string, number>();
  const sentAt = new Map<string, number>();
  const roundTrips: number[] = [];
  const failures: unknown[] = [];
  const total = settings.rate * settings.seconds;
  const intervalMs = 1000 / settings.rate;
  const start = performance.now();
  const calls: Promise<void>[] = [];
  for (let i = 0; i < total; i++) {
    const wait = start + i * intervalMs - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    const id = ids[i % ids.length]!;
    const sent = performance.now();
    const sentWall = Date.now();
    calls.push(
      sessions.append(id, { type: "steer", pageUrl: `/page/${id}/${i}` }).then(
        (answer) => {
          const key = `${id} ${answer.seq}`;
          answered.set(key, Date.now());
          sentAt.set(key, sentWall);
          roundTrips.push(performance.now() - sent);
        },
        (error: unknown) => void failures.push(error),
      ),
    );
  }
  await Promise.all(calls);
  const after = metricsOf(await cdp.send("Performance.getMetrics"));
  const cpuAfter = up.cpuMs();
  const clientCpu = process.cpuUsage(clientCpuBefore);
  const wallMs = (after["Timestamp"]! - before["Timestamp"]!) * 1000;
  const share = (metric: string) => shareOf(before, after, metric);
  emit({
    suite: "ui",
    figure: "main thread busy",
    rate: settings.rate,
    wall_ms: Math.round(wallMs),
    busy_share: share("TaskDuration"),
    idle_page_busy_share: idleShare,
    script_share: share("ScriptDuration"),
    layout_share: share("LayoutDuration"),
    style_share: share("RecalcStyleDuration"),
    services_cpu_share: Math.round(((cpuAfter - cpuBefore) / wallMs) * 1000) / 1000,
    bench_client_cpu_share: Math.round(((clientCpu.user + clientCpu.system) / 1000 / wallMs) * 1000) / 1000,
    target_share: 0.5,
    met: share("TaskDuration") < 0.5,
  });

  // The last appends' rows may be a frame or so behind: wait for them, within a bound.
  const settleUntil = Date.now() + SETTLE_MS;
  let seen: [string, number][] = [];
  for (;;) {
    seen = await page.evaluate(() => [...(globalThis as unknown as { berthBenchSeen: Map<string, number> }).berthBenchSeen]);
    const shown = new Set(seen.map(([key]) => key));
    if ([...answered.keys()].every((key) => shown.has(key)) || Date.now() > settleUntil) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const shownAt = new Map(seen);
  const delays: number[] = [];
  const delaysFromSend: number[] = [];
  for (const [key, at] of answered) {
    const shown = shownAt.get(key);
    if (shown === undefined) continue;
    delays.push(shown - at);
    delaysFromSend.push(shown - sentAt.get(key)!);
  }
  // An update never shown ranks after every shown one (a p50 or p99 that falls on one is null: never).
  const updates = percentiles([...delays, ...Array<number>(answered.size - delays.length).fill(Number.POSITIVE_INFINITY)]);
  emit({
    suite: "ui",
    figure: "update on screen",
    sessions: settings.sessions,
    queued: settings.queued,
    rate: settings.rate,
    appends: total,
    failed: failures.length,
    shown: delays.length,
    not_shown: answered.size - delays.length,
    ...updates,
    max_ms: Math.max(...delays),
    from_send: percentiles(delaysFromSend),
    append_round_trip: percentiles(roundTrips),
    target_p99_ms: 250,
    met: failures.length === 0 && (updates["p99_ms"] ?? Number.POSITIVE_INFINITY) <= 250,
  });
  await cdp.detach();
}

/** The share of wall time (the metrics' own Timestamp) a duration metric grew by between two readings. */
function shareOf(before: Record<string, number>, after: Record<string, number>, metric: string): number {
  const wall = after["Timestamp"]! - before["Timestamp"]!;
  return Math.round(((after[metric]! - before[metric]!) / wall) * 1000) / 1000;
}

function metricsOf(answer: { metrics: { name: string; value: number }[] }): Record<string, number> {
  return Object.fromEntries(answer.metrics.map(({ name, value }) => [name, value]));
}

function round1(value: number): number {
  return Math.round(value * 10) / 10;
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
}
