/**
 * What `@berth/client` must do the same way through each of its entries: the Node entry's tests
 * (client.test.ts) and the browser entry's (web-client.test.ts) run these against real services.
 */
import { Code } from "@connectrpc/connect";
import { BerthClientError, type BerthBase, type SessionWatchEvent } from "@berth/client";
import { expect } from "vitest";

/** Appends, then watches: the backlog, caught-up, a live entry (appended once caught up) with its snapshot. */
export async function appendThenWatch(berth: BerthBase, id: string): Promise<void> {
  await berth.append(id, { type: "generate", pageUrl: "/pricing", count: 3 });
  const seen: string[] = [];
  for await (const event of berth.watch(id, { includeSnapshot: true, timeoutMs: 20_000 })) {
    seen.push(label(event));
    if (event.kind === "caughtUp") await berth.append(id, { type: "steer", pageUrl: "/pricing" });
    if (event.kind === "entry" && event.live) {
      expect(event.snapshot?.phase).toBe("steer_requested");
      break;
    }
  }
  expect(seen).toEqual(["entry 1 generate", "caughtUp 1", "live 2 steer"]);
}

/**
 * A watch the service ends for falling behind (`berth` on a sessions service started with
 * `--watch-buffer 4`) resumes by itself, missing and repeating no entry.
 */
export async function resumeAfterLag(berth: BerthBase, id: string): Promise<void> {
  await berth.append(id, { type: "steer" });
  const watch = berth.watch(id, { timeoutMs: 50_000 })[Symbol.asyncIterator]();
  expect(label((await watch.next()).value as SessionWatchEvent)).toBe("entry 1 steer");
  expect(label((await watch.next()).value as SessionWatchEvent)).toBe("caughtUp 1");
  // 800 entries while nobody reads, against a buffer of 4: the service must end this watcher.
  for (let batch = 0; batch < 8; batch++)
    await berth.sessions.appendMany(
      id,
      Array.from({ length: 100 }, (_, i) => ({ type: "steer", n: batch * 100 + i })),
    );
  const seqs: bigint[] = [];
  let resumed = 0;
  while (seqs.at(-1) !== 801n) {
    const next = await watch.next();
    if (next.done) throw new Error("the watch ended");
    if (next.value.kind === "resumed") resumed++;
    if (next.value.kind === "entry") seqs.push(next.value.entry.seq);
  }
  await watch.return?.(undefined);
  expect(resumed).toBeGreaterThanOrEqual(1);
  expect(seqs).toEqual(Array.from({ length: 800 }, (_, i) => BigInt(i + 2)));
}

/**
 * Every session's changes (WatchSessions): the current state (the session appended before), caught
 * up, then a live append with its snapshot and a deletion, each at a higher revision; a watch
 * started from the last revision taken replays the deletion only.
 */
export async function watchEverySession(berth: BerthBase, id: string): Promise<void> {
  await berth.append(id, { type: "generate", pageUrl: "/pricing", count: 3 });
  const seen: string[] = [];
  let revision = 0n;
  for await (const event of berth.sessions.watchSessions({ includeCurrent: true, includeSnapshot: true, timeoutMs: 20_000 })) {
    if (event.kind === "caughtUp") {
      seen.push("caughtUp");
      await berth.append(id, { type: "steer", pageUrl: "/pricing" });
    }
    if (event.kind !== "event" || event.event.sessionId !== id) continue;
    const change = event.event;
    expect(change.revision).toBeGreaterThanOrEqual(revision);
    revision = change.revision;
    seen.push(change.deleted ? "deleted" : `${change.lastSeq} ${change.type} ${change.snapshot?.phase}`);
    if (change.lastSeq === 2n && !change.deleted) {
      const before = revision;
      await berth.sessions.delete(id);
      expect(before).toBeGreaterThan(0n);
    }
    if (change.deleted) break;
  }
  expect(seen).toEqual(["1 generate generate_requested", "caughtUp", "2 steer steer_requested", "deleted"]);
  const replayed: string[] = [];
  for await (const event of berth.sessions.watchSessions({ startRevision: revision - 1n, timeoutMs: 20_000 })) {
    if (event.kind === "event" && event.event.sessionId === id) replayed.push(event.event.deleted ? "deleted" : `${event.event.lastSeq}`);
    if (event.kind === "caughtUp") break;
  }
  expect(replayed).toContain("deleted");
}

/** Refusals with their typed details: SeqConflict, IdempotencyKeyReused. */
export async function typedRefusals(berth: BerthBase, id: string): Promise<void> {
  await berth.append(id, { type: "steer" }, { idempotencyKey: "k1" });
  const conflict = await berth.append(id, { type: "steer" }, { expectedSeq: 5 }).catch((e: unknown) => e);
  expect(conflict).toBeInstanceOf(BerthClientError);
  expect(conflict).toMatchObject({ code: Code.Aborted, reason: "SEQ_CONFLICT", seqConflict: { sessionId: id, expectedSeq: 5n, currentSeq: 1n } });
  const reused = await berth.append(id, { type: "generate" }, { idempotencyKey: "k1" }).catch((e: unknown) => e);
  expect(reused).toMatchObject({ code: Code.AlreadyExists, reason: "IDEMPOTENCY_KEY_REUSED", idempotencyKeyReused: { idempotencyKey: "k1", firstSeq: 1n } });
}

/** A watch event as one line: `entry 1 steer`, `live 2 steer`, `caughtUp 1`, … */
export function label(event: SessionWatchEvent): string {
  switch (event.kind) {
    case "entry":
      return `${event.live ? "live" : "entry"} ${event.entry.seq} ${event.entry.type}`;
    case "caughtUp":
      return `caughtUp ${event.lastSeq}`;
    case "progress":
      return `progress ${event.lastSeq}`;
    case "resumed":
      return `resumed ${event.fromSeq}`;
  }
}
