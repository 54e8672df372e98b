import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { relieveDescriptorShortage } from "@berth/shared/descriptors";
import { createSessionStore, type SessionStoreOptions } from "../create-session-store.js";
import type { SessionStore } from "../session-store.js";

let dir: string;
const stores: SessionStore[] = [];

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-journal-fds-"));
});

afterEach(async () => {
  for (const store of stores.splice(0)) await store.close().catch(() => undefined);
  fs.rmSync(dir, { recursive: true, force: true });
});

function open(options: Partial<SessionStoreOptions> = {}): SessionStore {
  const store = createSessionStore({ dir: path.join(dir, "sessions"), clock: new ManualClock(), snapshotIdleMs: 0, ...options });
  stores.push(store);
  return store;
}

/** The journals of `dir` this process has open (/proc/self/fd), by session id. */
function journalsHeldOpen(): string[] {
  const held: string[] = [];
  for (const fd of fs.readdirSync("/proc/self/fd")) {
    let target: string;
    try {
      target = fs.readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      continue;
    }
    if (target.startsWith(dir) && target.endsWith(".jsonl")) held.push(path.basename(target, ".jsonl"));
  }
  return held.sort();
}

const checkpoint = (reason: string) => ({ type: "checkpoint", reason });

describe("journals kept open", () => {
  it("are at most maxOpenJournals, the least recently used idle ones closed first; their sessions stay cached and append again", async () => {
    const store = open({ cacheSize: 100, maxOpenJournals: 3 });
    for (const id of ["s1", "s2", "s3"]) await store.append(id, [checkpoint("first")]);
    expect(journalsHeldOpen()).toEqual(["s1", "s2", "s3"]);
    // s1 is used again (a read), so s2 is now the least recently used.
    expect(store.getSnapshot("s1")?.lastSeq).toBe(1);
    await store.append("s4", [checkpoint("first")]);
    expect(journalsHeldOpen()).toEqual(["s1", "s3", "s4"]);
    expect(store.stats()).toMatchObject({ openSessions: 4, openJournals: 3 });
    // s2's state never left memory: no replay, no hydration, its next append reopens its file.
    const { replays, hydrations } = store.stats();
    expect((await store.append("s2", [checkpoint("second")])).lastSeq).toBe(2);
    expect(store.stats()).toMatchObject({ replays, hydrations, openSessions: 4, openJournals: 3 });
    // s3, appended to before s1 was read, was the least recently used.
    expect(journalsHeldOpen()).toEqual(["s1", "s2", "s4"]);
    const seqs: number[] = [];
    for await (const entry of store.read("s2")!.entries) seqs.push(entry.entry.seq);
    expect(seqs).toEqual([1, 2]);
  });

  it("are all closed but those being written when a descriptor is refused anywhere in the process, until the store closes", async () => {
    const warnings: string[] = [];
    const logger = { debug() {}, info() {}, warn: (fields: object, msg?: string) => void warnings.push(`${msg} ${JSON.stringify(fields)}`), error() {} };
    const store = open({ logger });
    await store.append("s1", [checkpoint("first")]);
    await store.append("s2", [checkpoint("first")]);
    // s3's append is on its way to disk while the shortage is met: its journal stays open.
    const writing = store.append("s3", [checkpoint("first")]);
    expect(journalsHeldOpen()).toEqual(["s1", "s2", "s3"]);
    expect(relieveDescriptorShortage()).toBe(2);
    expect(journalsHeldOpen()).toEqual(["s3"]);
    expect(warnings).toEqual(['no descriptor left somewhere in the service: closed the journals of idle sessions {"closed":2}']);
    await writing;
    expect((await store.append("s1", [checkpoint("second")])).lastSeq).toBe(2);
    await store.close();
    expect(journalsHeldOpen()).toEqual([]);
    await open().append("s5", [checkpoint("first")]);
    // The closed store no longer answers the call.
    expect(relieveDescriptorShortage()).toBe(1);
  });
});

describe("a read", () => {
  it("holds no descriptor while its consumer waits", async () => {
    const store = open({ maxOpenJournals: 1 });
    // Entries of 10 KiB: the read takes several chunks of the file.
    for (let i = 0; i < 20; i++) await store.append("s1", [checkpoint("x".repeat(10_000))]);
    await store.append("other", [checkpoint("first")]);
    expect(journalsHeldOpen()).toEqual(["other"]);
    const reading = store.read("s1")!.entries[Symbol.asyncIterator]();
    const seqs: number[] = [];
    for (let i = 0; i < 10; i++) {
      const step = await reading.next();
      seqs.push((step.value as { entry: { seq: number } }).entry.seq);
      expect(journalsHeldOpen()).toEqual(["other"]);
    }
    for (let step = await reading.next(); !step.done; step = await reading.next()) seqs.push(step.value.entry.seq);
    expect(seqs).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
  });

  it("of a session deleted under it ends SESSION_DELETED, never with the new session's entries", async () => {
    const store = open();
    for (let i = 0; i < 20; i++) await store.append("s1", [checkpoint("x".repeat(10_000))]);
    const reading = store.read("s1")!.entries[Symbol.asyncIterator]();
    expect((await reading.next()).value?.entry.seq).toBe(1);
    await store.delete("s1");
    for (let i = 0; i < 20; i++) await store.append("s1", [checkpoint("y".repeat(10_000))]);
    const seen: string[] = [];
    const ended = await (async () => {
      for (let step = await reading.next(); !step.done; step = await reading.next())
        seen.push(String((step.value.entry.event as { reason: string }).reason[0]));
    })().catch((error: unknown) => error);
    expect(ended).toMatchObject({ code: "not_found", reason: "SESSION_DELETED", details: { sessionId: "s1" } });
    expect(seen.filter((letter) => letter === "y")).toEqual([]);
  });
});
