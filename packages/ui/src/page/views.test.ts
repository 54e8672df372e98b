import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { BudgetEventKind, BudgetEventSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { LockEventKind, LockEventSchema } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionChangeSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import type { RevisionWatchEvent } from "@berth/client/web";
import { beforeAll, describe, expect, it } from "vitest";
import { BudgetView, QUEUE_STEP } from "./budget-panel.js";
import { LocksView } from "./locks-panel.js";
import { keepView, type RevisionView } from "./revision-view.js";
import { SessionsView } from "./sessions-panel.js";

beforeAll(() => {
  // The views tell the page to render on the next frame; here there is no page.
  Object.assign(globalThis, { requestAnimationFrame: (callback: () => void) => setTimeout(callback, 0) });
});

async function* stream<E>(...events: RevisionWatchEvent<E>[]): AsyncGenerator<RevisionWatchEvent<E>> {
  yield* events;
}

/** A view that records what it was told. */
function recorder(): RevisionView<string> & { calls: string[] } {
  const calls: string[] = [];
  return { calls, replace: (current) => calls.push(`replace ${current.join(",")}`), apply: (event) => calls.push(`apply ${event}`) };
}

describe("keepView", () => {
  it("replaces the view with the current state at caughtUp (never half of it on screen), then applies each change", async () => {
    const view = recorder();
    let live = 0;
    await keepView(
      stream<string>(
        { kind: "event", event: "a" },
        { kind: "event", event: "b" },
        { kind: "caughtUp", revision: 2n, reset: false },
        { kind: "event", event: "c" },
      ),
      view,
      () => live++,
    );
    expect(view.calls).toEqual(["replace a,b", "apply c"]);
    expect(live).toBe(1);
  });

  it("after a resume applies what was replayed at its caughtUp; a reset replaces the view", async () => {
    const view = recorder();
    const resumed = { kind: "resumed", revision: 3n, error: undefined as never } as const;
    await keepView(
      stream<string>(
        { kind: "caughtUp", revision: 1n, reset: false },
        resumed,
        { kind: "event", event: "d" },
        { kind: "caughtUp", revision: 4n, reset: false },
        resumed,
        { kind: "event", event: "x" },
        { kind: "caughtUp", revision: 9n, reset: true },
      ),
      view,
      () => {},
    );
    expect(view.calls).toEqual(["replace ", "apply d", "replace x"]);
  });
});

describe("LocksView", () => {
  const at = (ms: number) => timestampFromMs(ms);
  const event = (kind: LockEventKind, owner: string, extra: { fencingToken?: bigint; position?: number } = {}) =>
    create(LockEventSchema, { file: "/src/a.ts", kind, owner, time: at(1000), ...extra });

  it("keeps the holder and the waiters in order; a grant takes its waiter out, a release the holder, an empty lock leaves", () => {
    const view = new LocksView();
    view.replace([event(LockEventKind.CURRENT_HOLDER, "one", { fencingToken: 1n }), event(LockEventKind.CURRENT_WAITER, "two", { position: 1 })]);
    view.apply(event(LockEventKind.WAITER_JOINED, "three", { position: 2 }));
    expect(view.files.get("/src/a.ts")?.waiters.map((w) => w.owner)).toEqual(["two", "three"]);
    view.apply(event(LockEventKind.RELEASED, "one", { fencingToken: 1n }));
    view.apply(event(LockEventKind.GRANTED, "two", { fencingToken: 2n }));
    expect(view.files.get("/src/a.ts")?.holder).toMatchObject({ owner: "two", fencingToken: 2n });
    expect(view.files.get("/src/a.ts")?.waiters.map((w) => w.owner)).toEqual(["three"]);
    view.apply(event(LockEventKind.WAITER_LEFT, "three", { position: 1 }));
    // A late release of an older token does not take the new holder away.
    view.apply(event(LockEventKind.EXPIRED, "one", { fencingToken: 1n }));
    expect(view.files.get("/src/a.ts")?.holder?.owner).toBe("two");
    view.apply(event(LockEventKind.EXPIRED, "two", { fencingToken: 2n }));
    expect(view.files.size).toBe(0);
    expect(view.log.map((e) => `${e.owner} ${LockEventKind[e.kind]}`)).toEqual([
      "two EXPIRED",
      "one EXPIRED",
      "three WAITER_LEFT",
      "two GRANTED",
      "one RELEASED",
      "three WAITER_JOINED",
    ]);
  });
});

describe("BudgetView", () => {
  const budgetEvent = (kind: BudgetEventKind, subject: ReturnType<typeof create<typeof BudgetEventSchema>>["subject"]) =>
    create(BudgetEventSchema, { kind, subject, time: timestampFromMs(5000) });

  it("keeps the queue in order with each request's ETA and reason, and the reservations and running work as they come and go", () => {
    const view = new BudgetView();
    view.replace(
      [
        budgetEvent(BudgetEventKind.REQUEST_QUEUED, {
          case: "request",
          value: { id: "q1", owner: "first", waitForText: "memory", eta: { seconds: 30n } } as never,
        }),
        budgetEvent(BudgetEventKind.RESERVATION_MADE, { case: "reservation", value: { id: "r1", owner: "build", runningIds: [] } as never }),
      ],
      { kind: "caughtUp", revision: 1n, reset: false },
    );
    view.apply(budgetEvent(BudgetEventKind.REQUEST_QUEUED, { case: "request", value: { id: "q2", owner: "second", waitForText: "cpu" } as never }));
    expect(view.queueList().map((entry) => entry.owner)).toEqual(["first", "second"]);
    expect(view.etas.get("q1")).toMatchObject({ etaMs: 30_000, reason: "memory", readAt: 5000 });
    view.apply(budgetEvent(BudgetEventKind.REQUEST_ADMITTED, { case: "request", value: { id: "q1" } as never }));
    view.apply(budgetEvent(BudgetEventKind.RUNNING_REGISTERED, { case: "running", value: { id: "w1", name: "web" } as never }));
    view.apply(budgetEvent(BudgetEventKind.RESERVATION_RELEASED, { case: "reservation", value: { id: "r1" } as never }));
    expect(view.queueList().map((entry) => entry.owner)).toEqual(["second"]);
    expect(view.etas.has("q1")).toBe(false);
    expect([...view.reservations.keys()]).toEqual([]);
    expect([...view.running.keys()]).toEqual(["w1"]);
    view.apply(budgetEvent(BudgetEventKind.RUNNING_EXPIRED, { case: "running", value: { id: "w1" } as never }));
    expect(view.running.size).toBe(0);
  });

  it("holds the front of a long queue and counts the rest; asks for the front again once it ran down", () => {
    const view = new BudgetView();
    view.queueLimit = 4;
    const queued = (id: string, position: number) =>
      budgetEvent(BudgetEventKind.REQUEST_QUEUED, { case: "request", value: { id, owner: id, position } as never });
    const left = (id: string) => budgetEvent(BudgetEventKind.REQUEST_LEFT, { case: "request", value: { id } as never });
    view.replace([queued("a", 1), queued("b", 2), queued("c", 3)], { kind: "caughtUp", revision: 1n, reset: false, queueSize: 3 });
    view.apply(queued("d", 4));
    view.apply(queued("e", 5));
    expect([view.queueList().map((entry) => entry.id), view.queueSize]).toEqual([["a", "b", "c", "d"], 5]);
    // One that resumes its place joins ahead of the others.
    view.apply(left("b"));
    view.apply(queued("b2", 2));
    expect([view.queueList().map((entry) => entry.id), view.queueSize]).toEqual([["a", "b2", "c", "d"], 5]);
    // Beyond the held front: counted only.
    view.apply(left("e"));
    view.apply(queued("f", 5));
    expect([view.queueList().map((entry) => entry.id), view.queueSize]).toEqual([["a", "b2", "c", "d"], 5]);
    for (const id of ["a", "b2"]) view.apply(left(id));
    expect(view.describeFront()).toBe(false);
    view.apply(left("c"));
    expect([view.queueList().map((entry) => entry.id), view.queueSize]).toEqual([["d"], 2]);
    expect(view.describeFront()).toBe(true);
    expect(view.describeFront()).toBe(false);
    view.replace([queued("d", 1), queued("f", 2)], { kind: "caughtUp", revision: 2n, reset: false, queueSize: 2 });
    expect(view.describeFront()).toBe(false);
    expect(view.describeFront(true)).toBe(true);
    expect(view.queueLimit).toBe(4 + QUEUE_STEP);
  });
});

describe("SessionsView", () => {
  it("lists the sessions by their latest change, and forgets a deleted one", () => {
    const view = new SessionsView();
    const change = (sessionId: string, ms: number, deleted = false) => create(SessionChangeSchema, { sessionId, appendTime: timestampFromMs(ms), deleted });
    view.replace([change("old", 1000), change("new", 2000)]);
    expect(view.sorted().map((c) => c.sessionId)).toEqual(["new", "old"]);
    view.apply(change("old", 3000));
    expect(view.sorted().map((c) => c.sessionId)).toEqual(["old", "new"]);
    view.apply(change("new", 4000, true));
    expect(view.sorted().map((c) => c.sessionId)).toEqual(["old"]);
  });
});
