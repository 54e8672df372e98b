import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import type { BerthError } from "@berth/shared/errors";
import { nodeCommitIo, type CommitIo } from "./journal/group-commit.js";
import { createSessionStore } from "./create-session-store.js";

/**
 * The file system goes read-only under a write (ext4 remounts itself read-only on a disk error):
 * the write landed, its sync fails, and the journal can be neither cut back nor opened for writing.
 */
const disk = vi.hoisted(() => ({ readOnly: false, descriptorsLeft: Infinity }));
const erofs = (call: string) => Object.assign(new Error(`EROFS: read-only file system, ${call}`), { code: "EROFS" });
vi.mock("node:fs", async (real) => {
  const actual = await real<typeof import("node:fs")>();
  const guarded = {
    ftruncateSync: (...args: Parameters<typeof actual.ftruncateSync>) => {
      if (disk.readOnly) throw erofs("ftruncate");
      return actual.ftruncateSync(...args);
    },
    openSync: (...args: Parameters<typeof actual.openSync>) => {
      const flags = args[1];
      if (disk.readOnly && flags !== undefined && flags !== "r") throw erofs("open");
      if (disk.descriptorsLeft <= 0) throw Object.assign(new Error("EMFILE: too many open files, open"), { code: "EMFILE" });
      return actual.openSync(...args);
    },
    closeSync: (...args: Parameters<typeof actual.closeSync>) => {
      disk.descriptorsLeft++;
      return actual.closeSync(...args);
    },
  };
  return { ...actual, ...guarded, default: { ...actual, ...guarded } };
});

let dir: string;
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-store-ro-"));
});
afterEach(() => {
  disk.readOnly = false;
  disk.descriptorsLeft = Infinity;
  fs.rmSync(dir, { recursive: true, force: true });
});

/** Writes go through; the sync fails once `disk.readOnly`, as it does when the file system errs under it. */
const io: CommitIo = {
  write: nodeCommitIo.write,
  async fdatasync(fd) {
    if (disk.readOnly) throw erofs("fdatasync");
    return nodeCommitIo.fdatasync(fd);
  },
};

describe("a state directory that goes read-only under a write", () => {
  it("tells the append being written that its outcome is unknown (it may stay, whole), the ones queued behind it that nothing was kept, and reads go on", async () => {
    const store = createSessionStore({ dir: path.join(dir, "sessions"), clock: new ManualClock(), io });
    await store.append("s1", [{ type: "generate" }]);
    disk.readOnly = true;
    const inFlight = store.append(
      "s1",
      [
        { type: "checkpoint", revision: 1 },
        { type: "checkpoint", revision: 2 },
      ],
      { idempotencyKey: "in-flight" },
    );
    await Promise.resolve();
    const queued = store.append("s1", [{ type: "checkpoint", revision: 3 }], { idempotencyKey: "queued" });
    const unknown = (await inFlight.catch((e: unknown) => e)) as BerthError;
    expect(unknown).toMatchObject({ code: "unavailable", reason: "STATE_READ_ONLY", details: { outcome: "unknown" } });
    expect(unknown.message).toContain("may have been written, in whole (never in part), or not at all");
    const refused = (await queued.catch((e: unknown) => e)) as BerthError;
    expect(refused).toMatchObject({ code: "unavailable", reason: "STATE_READ_ONLY" });
    expect(refused.message).toContain("nothing of it kept");
    // The journal could not be cut back: re-read, the in-flight append is there, whole; the queued one is not.
    const view = store.getSnapshot("s1", { includeCompleted: true })!;
    expect(view.lastSeq).toBe(3);
    const keys: Array<string | undefined> = [];
    for await (const entry of store.read("s1")!.entries) keys.push(entry.idempotencyKey);
    expect(keys).toEqual([undefined, "in-flight", "in-flight"]);
    // Later appends are refused before anything is written; the retry with the same key finds the kept one.
    await expect(store.append("s1", [{ type: "checkpoint", revision: 4 }])).rejects.toMatchObject({ reason: "STATE_READ_ONLY" });
    expect(
      await store.append(
        "s1",
        [
          { type: "checkpoint", revision: 1 },
          { type: "checkpoint", revision: 2 },
        ],
        { idempotencyKey: "in-flight" },
      ),
    ).toMatchObject({
      firstSeq: 2,
      lastSeq: 3,
      duplicate: true,
    });
    disk.readOnly = false;
    await store.close();
  });
});

describe("no descriptor left to open a journal", () => {
  it("closes the journals of idle sessions and opens it; they reopen on their next append", async () => {
    const warnings: string[] = [];
    const logger = { debug() {}, info() {}, warn: (fields: object, msg?: string) => void warnings.push(`${msg} ${JSON.stringify(fields)}`), error() {} };
    const store = createSessionStore({ dir: path.join(dir, "sessions"), clock: new ManualClock(), logger });
    await store.append("s1", [{ type: "generate" }]);
    await store.append("s2", [{ type: "generate" }]);
    // Every descriptor taken: the next open fails until one is closed.
    disk.descriptorsLeft = 0;
    expect((await store.append("s3", [{ type: "generate" }])).lastSeq).toBe(1);
    expect(warnings).toEqual(['no descriptor left somewhere in the service: closed the journals of idle sessions {"closed":2}']);
    disk.descriptorsLeft = Infinity;
    expect((await store.append("s1", [{ type: "agent_done" }])).lastSeq).toBe(2);
    await store.close();
  });

  it("closes them for a read or a watch's backlog, and retries; with none to close, refuses RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES, never a raw EMFILE", async () => {
    const store = createSessionStore({ dir: path.join(dir, "sessions"), clock: new ManualClock() });
    await store.append("s1", [{ type: "generate" }]);
    await store.append("s2", [{ type: "generate" }]);
    disk.descriptorsLeft = 0;
    const seqs: number[] = [];
    for await (const entry of store.read("s1")!.entries) seqs.push(entry.entry.seq);
    expect(seqs).toEqual([1]);
    // Nothing idle is left to close now.
    disk.descriptorsLeft = 0;
    const refusal = {
      code: "resource_exhausted",
      reason: "TOO_MANY_OPEN_FILES",
      options: { retryAfterMs: 1000 },
      details: { sessionId: "s1", errno: "EMFILE" },
    };
    await expect(collect(store.read("s1")!.entries)).rejects.toMatchObject(refusal);
    await expect(collect(store.watch("s1"))).rejects.toMatchObject(refusal);
    await store.close();
    // A session not cached is opened from its files: refused so as well.
    const reopened = createSessionStore({ dir: path.join(dir, "sessions"), clock: new ManualClock() });
    expect(() => reopened.getSnapshot("s2")).toThrow(
      expect.objectContaining({ reason: "TOO_MANY_OPEN_FILES", details: expect.objectContaining({ sessionId: "s2" }) }),
    );
    disk.descriptorsLeft = Infinity;
    expect(reopened.getSnapshot("s2")?.lastSeq).toBe(1);
    await reopened.close();
  });
});

async function collect<T>(source: AsyncIterable<T>): Promise<T[]> {
  const items: T[] = [];
  for await (const item of source) items.push(item);
  return items;
}
