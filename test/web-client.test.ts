/**
 * The browser entry (`@berth/client/web`, connect-web over Node's own fetch) beside the Node entry,
 * against real services, each scenario the same through both: appends and watches (the backlog,
 * caught-up, live, a resume after the service ended a lagging watcher) and refusals with their
 * typed details (client-scenarios.ts, which client.test.ts runs through the Node entry); a lock
 * held on its Hold stream, fenced writes, lock and budget watches by revision, reservations (both
 * entries here). Where a page differs it is said: the owner it gives, the lock paths it takes, and
 * Admit, which it refuses as a stream fetch cannot make.
 */
import * as path from "node:path";
import { Code } from "@connectrpc/connect";
import { BudgetEventKind } from "@berth/api/berth/budget/v1/budget_service_pb";
import { LockEventKind } from "@berth/api/berth/locks/v1/lock_service_pb";
import * as node from "@berth/client";
import * as web from "@berth/client/web";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import { appendThenWatch, resumeAfterLag, typedRefusals, watchEverySession } from "./client-scenarios.js";
import { makeTempDir, startService, stopAll, type StartedService } from "./harness.js";

const TOKEN = "web-client-test-token";
let sessions: StartedService;
let budget: BudgetUnderTest;

beforeAll(async () => {
  [sessions, budget] = await Promise.all([startService("sessions", { env: { BERTH_TOKEN: TOKEN } }), startBudget({ env: { BERTH_TOKEN: TOKEN } })]);
}, 60_000);
afterAll(stopAll);

/** What both entries' `Berth` offer: the same class on either side. */
type AnyBerth = web.BerthBase;

const ENTRIES: readonly { readonly entry: string; readonly berth: () => AnyBerth; readonly owner: RegExp }[] = [
  {
    entry: "node",
    berth: () => new node.Berth({ sessionsUrl: sessions.url("sessions"), budgetUrl: budget.url, token: TOKEN, env: {} }),
    owner: /^.+@.+ pid \d+$/,
  },
  {
    entry: "web",
    berth: () => new web.Berth({ sessionsUrl: sessions.url("sessions"), budgetUrl: budget.url, token: TOKEN }),
    // Node has no page to name: no browser in its user agent, no origin.
    owner: /^browser tab$/,
  },
];

describe("through the browser entry, as through the Node entry (client.test.ts)", () => {
  const berth = () => new web.Berth({ sessionsUrl: sessions.url("sessions"), budgetUrl: budget.url, token: TOKEN });

  it("appends, then watches: the backlog, caught-up, a live entry with its snapshot", () => appendThenWatch(berth(), "web-watch"));

  it("resumes a watch the service ended for falling behind, missing and repeating no entry", { timeout: 60_000 }, async () => {
    const slow = await startService("sessions", { args: ["--watch-buffer", "4"] });
    try {
      await resumeAfterLag(new web.Berth({ sessionsUrl: slow.url("sessions") }), "web-lag");
    } finally {
      await slow.stop();
    }
  });

  it("watches every session: the current state, caught up, a live change with its snapshot, a deletion; a resume by revision", () =>
    watchEverySession(berth(), "web-every-session"));

  it("refuses with typed details: SeqConflict, IdempotencyKeyReused; without the token, UNAUTHENTICATED", async () => {
    await typedRefusals(berth(), "web-refusals");
    const anonymous = new web.Berth({ sessionsUrl: sessions.url("sessions") });
    await expect(anonymous.sessions.snapshot("web-refusals")).rejects.toMatchObject({ code: Code.Unauthenticated, reason: "TOKEN_MISSING" });
  });
});

describe.each(ENTRIES)("through the $entry entry", ({ entry, berth: makeBerth, owner }) => {
  let berth: AnyBerth;
  beforeAll(() => {
    berth = makeBerth();
  });

  it("holds a lock on its Hold stream, watched by revision; fences a write with it; frees it on release", async () => {
    const file = path.join(makeTempDir(`berth-${entry}-lock-`), "src/app.css");
    const stop = new AbortController();
    const watched: string[] = [];
    const caughtUp = resolvable();
    const watching = (async () => {
      for await (const event of berth.locks.watch(file, { includeCurrent: true, signal: stop.signal })) {
        if (event.kind === "caughtUp") caughtUp.resolve();
        else if (event.kind === "event") watched.push(LockEventKind[event.event.kind]);
        if (watched.at(-1) === "RELEASED") return;
      }
    })();
    // The watch has caught up before the lock is taken: the grant is a change it sees.
    await caughtUp.promise;
    const lease = await berth.lock(file);
    expect(lease.file).toBe(file);
    expect(lease.lease.owner).toMatch(owner);
    const busy = await makeBerth()
      .lock(file, { maxWaitMs: 0, owner: "other" })
      .catch((e: unknown) => e);
    expect(busy).toMatchObject({ code: Code.ResourceExhausted, reason: "WAIT_EXHAUSTED", lockHeld: { fencingToken: lease.fencingToken } });
    expect((await berth.append(`${entry}-fenced`, { type: "steer" }, { fence: { file, fencingToken: lease.fencingToken } })).seq).toBe(1n);
    expect(await lease.release()).toBe(true);
    expect(lease.signal.aborted).toBe(true);
    expect((await berth.locks.inspect(file)).holder).toBeUndefined();
    await watching;
    stop.abort();
    expect(watched.filter((kind) => kind === "GRANTED" || kind === "RELEASED")).toEqual(["GRANTED", "RELEASED"]);
  });

  it("reserves and releases, each change seen by watchBudget; watches the machine's samples", { timeout: 30_000 }, async () => {
    const stop = new AbortController();
    const caughtUp = resolvable();
    const seen: string[] = [];
    let reservationId: string | undefined;
    const watching = (async () => {
      for await (const event of berth.budget.watchBudget({ includeCurrent: true, signal: stop.signal })) {
        if (event.kind === "caughtUp") caughtUp.resolve();
        if (event.kind !== "event" || event.event.subject.case !== "reservation") continue;
        // Its RESERVATION_MADE may come before reserve() answers: every reservation's changes are kept, this one's picked after.
        const id = event.event.subject.value.id;
        seen.push(`${BudgetEventKind[event.event.kind]} ${id}`);
        if (event.event.kind === BudgetEventKind.RESERVATION_RELEASED && id === reservationId) return;
      }
    })();
    await caughtUp.promise;
    const reserved = await berth.budget.reserve([web.start(`${entry}-page`, { memory: "1G" })], { ttlMs: 30_000 });
    reservationId = reserved.reservation!.id;
    expect(reserved.reservation!.owner).toMatch(owner);
    expect(await berth.budget.release(reservationId)).toBe(true);
    await watching;
    stop.abort();
    expect(seen.filter((change) => change.endsWith(` ${reservationId}`))).toEqual([
      `RESERVATION_MADE ${reservationId}`,
      `RESERVATION_RELEASED ${reservationId}`,
    ]);
    for await (const item of berth.budget.watchMachine({ timeoutMs: 20_000 })) {
      expect(item).toMatchObject({ kind: "sample", machine: { totalBytes: 16n * 1024n ** 3n } });
      break;
    }
  });
});

describe("where a page differs", () => {
  it("admit is refused at once, UNIMPLEMENTED BIDI_STREAM_UNSUPPORTED naming Reserve; the Node entry admits", async () => {
    const need = [web.start("web-admit", { memory: "1G" })];
    const refused = await new web.Berth({ budgetUrl: budget.url, token: TOKEN }).admit(need, () => "ran").catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: Code.Unimplemented, reason: "BIDI_STREAM_UNSUPPORTED", errorInfo: { metadata: { instead: "Reserve" } } });
    expect(await new node.Berth({ budgetUrl: budget.url, token: TOKEN }).admit(need, () => "ran")).toBe("ran");
  });

  it("a relative lock path is refused unless cwd says what it is relative to", async () => {
    const project = makeTempDir("berth-web-project-");
    const berth = new web.Berth({ sessionsUrl: sessions.url("sessions"), token: TOKEN });
    await expect(berth.lock("src/app.css")).rejects.toMatchObject({ code: Code.InvalidArgument, reason: "INVALID_FIELD" });
    await using lease = await berth.lock("src/app.css", { cwd: project });
    expect(lease.file).toBe(path.join(project, "src/app.css"));
  });
});

/** A promise and what settles it. */
function resolvable(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}
