import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { nodeCommitIo, type CommitIo, type FsyncMode } from "./journal/group-commit.js";
import { dir, expectBerthError, journal, open, temporaryStores } from "./session-store-fixtures.js";

temporaryStores();

function countingIo(base: CommitIo = nodeCommitIo) {
  const counts = { writes: 0, syncs: 0 };
  let failWrites: NodeJS.ErrnoException | undefined;
  let partial = false;
  const io: CommitIo = {
    write(fd, data, offset, length) {
      counts.writes++;
      if (failWrites) {
        // Half the bytes reach the file before the error: the store must cut them back.
        if (partial) base.write(fd, data, offset, Math.max(1, Math.floor(length / 2)));
        throw failWrites;
      }
      return base.write(fd, data, offset, length);
    },
    async fdatasync(fd) {
      counts.syncs++;
      return base.fdatasync(fd);
    },
  };
  return {
    io,
    counts,
    fail(code: string | undefined, writePartial = false) {
      partial = writePartial;
      if (code === undefined) failWrites = undefined;
      else {
        failWrites = Object.assign(new Error(`${code}: simulated`), { code });
      }
    },
  };
}

describe("appends", () => {
  it("appends, numbers entries from 1 and serves the snapshot", async () => {
    const store = open();
    const first = await store.append("s1", [{ type: "generate", count: 3, pageUrl: "http://localhost/" }]);
    expect(first).toMatchObject({ firstSeq: 1, lastSeq: 1, duplicate: false });
    expect(first.snapshot.phase).toBe("generate_requested");
    const second = await store.append("s1", [{ type: "agent_done" }, { type: "variant_mounted", variant: 1 }]);
    expect(second).toMatchObject({ firstSeq: 2, lastSeq: 3 });
    expect(second.snapshot.renderState).toBe("mounted");
    const view = store.getSnapshot("s1");
    expect(view).toMatchObject({ lastSeq: 3, exists: true });
    expect(view!.snapshot).toBe(second.snapshot);
    const lines = fs
      .readFileSync(journal("s1"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => l.seq)).toEqual([1, 2, 3]);
    expect(lines[1]).toMatchObject({ id: "s1", type: "agent_done", ts: "2026-01-01T00:00:00.000Z", n: 2, event: { type: "agent_done", id: "s1" } });
    expect(Object.keys(lines[0])).toEqual(["seq", "id", "type", "ts", "event", "crc"]);
    expect((fs.statSync(journal("s1")).mode & 0o777).toString(8)).toBe("600");
  });

  it("rejects bad ids and bad or oversized events with nothing written", async () => {
    const store = open({ maxEventBytes: 200 });
    await expectBerthError(store.append("../etc", [{ type: "x" }]), "invalid_argument");
    await expectBerthError(store.append("a/b", [{ type: "x" }]), "invalid_argument");
    await expectBerthError(store.append("s1", []), "invalid_argument");
    await expectBerthError(store.append("s1", [{ type: "ok" }, { notype: 1 }]), "invalid_argument");
    await expectBerthError(store.append("s1", [{ type: "ok" }, null]), "invalid_argument");
    await expectBerthError(store.append("s1", [{ type: "x", id: "other" }]), "invalid_argument");
    const big = await expectBerthError(store.append("s1", [{ type: "ok" }, { type: "x", blob: "y".repeat(300) }]), "invalid_argument", "EVENT_TOO_LARGE");
    expect(big.details).toMatchObject({ field: "events[1]", limit: 200 });
    expect(big.message).toMatch(/events\[1\].*over the limit of 200 bytes/);
    await expectBerthError(store.append("s1", [{ type: "x" }], { idempotencyKey: "k".repeat(129) }), "invalid_argument");
    expect(fs.readdirSync(path.join(dir, "sessions"))).toEqual([]);
    expect(() => store.getSnapshot("bad id")).toThrow(/session_id/);
    expect(store.has("s1")).toBe(false);
    expect(fs.readdirSync(dir)).toEqual(["sessions"]);
  });

  it("refuses an append whose expected seq is not the current one, with the current seq", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }], { expectedSeq: 0 });
    await store.append("s1", [{ type: "agent_phase", phase: "plan" }], { expectedSeq: 1 });
    const conflict = await expectBerthError(store.append("s1", [{ type: "steer" }], { expectedSeq: 1 }), "aborted", "SEQ_CONFLICT");
    expect(conflict.message).toContain("expected seq 1 but the session is at seq 2");
    expect(conflict.details).toMatchObject({ currentSeq: 2 });
    expect(store.getSnapshot("s1")!.lastSeq).toBe(2);
    const fresh = await expectBerthError(store.append("s2", [{ type: "steer" }], { expectedSeq: 4 }), "aborted", "SEQ_CONFLICT");
    expect(fresh.details).toMatchObject({ currentSeq: 0 });
  });

  it("refuses an append whose expected state does not hold: no session yet, or an existing one", async () => {
    const store = open();
    const missing = await expectBerthError(store.append("s1", [{ type: "steer" }], { expectedState: "exists" }), "aborted", "SEQ_CONFLICT");
    expect(missing.details).toMatchObject({ currentSeq: 0, expectedState: "exists" });
    expect(store.has("s1")).toBe(false);
    expect(await store.append("s1", [{ type: "generate" }], { expectedState: "no_session" })).toMatchObject({ firstSeq: 1 });
    const taken = await expectBerthError(store.append("s1", [{ type: "steer" }], { expectedState: "no_session" }), "aborted", "SEQ_CONFLICT");
    expect(taken.details).toMatchObject({ currentSeq: 1, expectedState: "no_session" });
    expect(await store.append("s1", [{ type: "steer" }], { expectedState: "exists" })).toMatchObject({ firstSeq: 2 });
    expect(await store.append("s1", [{ type: "steer" }], { expectedState: "any" })).toMatchObject({ firstSeq: 3 });
  });

  it("refuses an append whose fence check throws, with nothing written", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    const fence = () => {
      throw Object.assign(new Error("stale fence"), { code: "aborted" });
    };
    await expect(store.append("s1", [{ type: "steer" }], { fenceCheck: fence })).rejects.toThrow("stale fence");
    expect(store.getSnapshot("s1")!.lastSeq).toBe(1);
  });

  it("32 concurrent appenders get contiguous seqs with far fewer syncs than appends", async () => {
    const counter = countingIo();
    const store = open({ io: counter.io });
    await store.append("s1", [{ type: "generate" }]);
    counter.counts.syncs = 0;
    const results = await Promise.all(
      Array.from({ length: 32 }, (_, client) =>
        (async () => {
          const seqs: number[] = [];
          for (let i = 0; i < 8; i++) seqs.push((await store.append("s1", [{ type: "checkpoint", revision: client * 100 + i }])).firstSeq);
          return seqs;
        })(),
      ),
    );
    const all = results.flat().sort((a, b) => a - b);
    expect(all).toEqual(Array.from({ length: 256 }, (_, i) => i + 2));
    expect(counter.counts.syncs).toBeLessThan(256 / 4);
    const lines = fs
      .readFileSync(journal("s1"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l).seq);
    expect(lines).toEqual(Array.from({ length: 257 }, (_, i) => i + 1));
  });

  it("syncs once per append with fsync=always and never with none", async () => {
    for (const fsync of ["always", "none"] as FsyncMode[]) {
      const counter = countingIo();
      const store = open({ io: counter.io, fsync, dir: path.join(dir, fsync) });
      await Promise.all(Array.from({ length: 10 }, (_, i) => store.append("s1", [{ type: "checkpoint", revision: i }])));
      expect(counter.counts.syncs).toBe(fsync === "always" ? 10 : 0);
      expect(store.getSnapshot("s1")!.lastSeq).toBe(10);
    }
  });
});

describe("atomicity and write failures", () => {
  it("a failing write rejects the batch, cuts partial bytes back and rolls the state back", async () => {
    const counter = countingIo();
    const store = open({ io: counter.io });
    await store.append("s1", [{ type: "generate" }]);
    const sizeBefore = fs.statSync(journal("s1")).size;
    counter.fail("EIO", true);
    const failed = store.append("s1", [{ type: "agent_done" }, { type: "variant_mounted", variant: 1 }], { idempotencyKey: "k1" });
    const queued = store.append("s1", [{ type: "steer" }]);
    await expectBerthError(failed, "unavailable");
    await expectBerthError(queued, "unavailable");
    expect(fs.statSync(journal("s1")).size).toBe(sizeBefore);
    expect(store.getSnapshot("s1")).toMatchObject({ lastSeq: 1, snapshot: { phase: "generate_requested" } });
    counter.fail(undefined);
    const retried = await store.append("s1", [{ type: "agent_done" }], { idempotencyKey: "k1" });
    expect(retried).toMatchObject({ firstSeq: 2, duplicate: false });
    counter.fail("ENOSPC");
    const full = await expectBerthError(store.append("s1", [{ type: "steer" }]), "resource_exhausted", "DISK_FULL");
    expect(full.message).toBe(
      `session s1: the append was not written, nothing of it kept: the file system of the state directory ${path.join(dir, "sessions")} is full (ENOSPC); free space on it and retry (nothing is lost: reads go on, and writes resume once there is room, without a restart)`,
    );
    counter.fail(undefined);
    await store.close();
    const reopened = open();
    expect(reopened.getSnapshot("s1")).toMatchObject({ lastSeq: 2, snapshot: { phase: "variants_ready" } });
  });
});

describe("a failed first append", () => {
  it("leaves no journal behind", async () => {
    const counter = countingIo();
    const store = open({ io: counter.io });
    counter.fail("EIO");
    await expectBerthError(store.append("s1", [{ type: "generate" }]), "unavailable");
    expect(store.has("s1")).toBe(false);
    counter.fail(undefined);
    expect((await store.append("s1", [{ type: "generate" }])).firstSeq).toBe(1);
    expect(store.has("s1")).toBe(true);
  });
});
