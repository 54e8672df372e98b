import * as fs from "node:fs";
import * as path from "node:path";
import { beforeEach, describe, expect, it } from "vitest";
import { nodeCommitIo, type CommitIo } from "./journal/group-commit.js";
import type { SessionSnapshot } from "./reducer.js";
import { APPEND_OVERTAKEN_RETRY_MS, createSessionStore } from "./create-session-store.js";
import { clock, dir, expectBerthError, journal, open, seedLine, temporaryStores } from "./session-store-fixtures.js";
import { seedAppend, seedDirsOf, seedReadState } from "./testing/seed-writer.js";

temporaryStores();

/** The seqs of the journal's non-blank lines, in file order. */
function journalSeqs(id: string, root = path.join(dir, "sessions")): number[] {
  return fs
    .readFileSync(journal(id, root), "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => (JSON.parse(line) as { seq: number }).seq);
}

describe("beside another process appending in the seed's format", () => {
  let live: ReturnType<typeof seedDirsOf>;
  beforeEach(() => {
    live = seedDirsOf(path.join(dir, "project"));
  });

  it("reads the legacy root and copies it over on the first append, as the seed does", async () => {
    seedAppend(live, "old", { type: "generate", count: 1 });
    seedAppend(live, "old", { type: "agent_done" });
    // Move the journal to the legacy root, as an older version of the seed left it.
    fs.mkdirSync(live.legacyDir, { recursive: true });
    fs.renameSync(journal("old", live.dir), journal("old", live.legacyDir));
    const legacyBytes = fs.readFileSync(journal("old", live.legacyDir), "utf8");

    const store = open({ dir: live.dir, legacyDir: live.legacyDir });
    expect(store.has("old")).toBe(true);
    expect(store.getSnapshot("old")).toMatchObject({ lastSeq: 2, snapshot: { phase: "variants_ready" } });
    expect(store.list().map((v) => v.sessionId)).toEqual(["old"]);
    expect(fs.existsSync(journal("old", live.dir))).toBe(false);
    const appended = await store.append("old", [{ type: "steer" }]);
    expect(appended.firstSeq).toBe(3);
    const primary = fs.readFileSync(journal("old", live.dir), "utf8");
    expect(primary.startsWith(legacyBytes)).toBe(true);
    expect(fs.readFileSync(journal("old", live.legacyDir), "utf8")).toBe(legacyBytes);
    // A seed process now reads the primary, where berth's line is.
    expect(seedReadState(live, "old")).toMatchObject({ nextSeq: 4, snapshot: { phase: "steer_requested" } });
  });

  it("reads a session's last entry again as it is after our appends and another process's, not as an earlier read found it", async () => {
    const store = open({ dir: live.dir });
    const last = async (id: string) => {
      const lastSeq = store.getSnapshot(id)!.lastSeq;
      const seen = [];
      for await (const stored of (await store.read(id, lastSeq, 1))!.entries) seen.push([stored.entry.seq, stored.entry.type]);
      return seen;
    };
    await store.append("s2", [{ type: "generate", count: 2 }]);
    expect(await last("s2")).toEqual([[1, "generate"]]);
    expect(await last("s2")).toEqual([[1, "generate"]]);
    seedAppend(live, "s2", { type: "agent_done" });
    expect(await last("s2")).toEqual([[2, "agent_done"]]);
    expect(await last("s2")).toEqual([[2, "agent_done"]]);
    await store.append("s2", [{ type: "steer" }]);
    expect(await last("s2")).toEqual([[3, "steer"]]);
    await store.delete("s2");
    await store.append("s2", [{ type: "generate", count: 1 }]);
    expect(await last("s2")).toEqual([[4, "generate"]]);
    // Another writer rewrites the journal in place, same size and last seq: what we read before
    // describes another file.
    seedAppend(live, "s3", { type: "generate", count: 2 });
    const read = async () => {
      const seen = [];
      for await (const stored of (await store.read("s3", 1, 1))!.entries) seen.push(stored.entry.event);
      return seen;
    };
    expect(await read()).toMatchObject([{ count: 2 }]);
    const file = journal("s3", live.dir);
    const later = new Date(fs.statSync(file).mtimeMs + 2000);
    fs.writeFileSync(file, fs.readFileSync(file, "utf8").replace('"count":2', '"count":3'));
    fs.utimesSync(file, later, later);
    expect(store.getSnapshot("s3")!.lastSeq).toBe(1);
    expect(await read()).toMatchObject([{ count: 3 }]);
    // An entry too large to keep in memory is read from the journal each time.
    await store.append("s2", [{ type: "steer", note: "x".repeat(10_000) }]);
    expect(await last("s2")).toEqual([[5, "steer"]]);
    expect(await last("s2")).toEqual([[5, "steer"]]);
  });

  it("picks up an append made by another process with one catch-up", async () => {
    const store = open({ dir: live.dir });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    const watcher = store.watch("s1", 2);
    seedAppend(live, "s1", { type: "agent_done" });
    seedAppend(live, "s1", { type: "variant_mounted", variant: 1 });
    const view = store.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(3);
    expect(view.snapshot.renderState).toBe("mounted");
    const next = await store.append("s1", [{ type: "steer" }]);
    expect(next.firstSeq).toBe(4);
    const seen: number[] = [];
    for await (const item of watcher) {
      if (item.kind === "entry") seen.push(item.entry.seq);
      if (seen.length === 3) break;
    }
    expect(seen).toEqual([2, 3, 4]);
    expect(store.stats().replays).toBe(0);
  });

  it("refuses, retryably and writing nothing, appends that another process's line overtook before they were written", async () => {
    const store = open({ dir: live.dir });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    const watcher = store.watch("s1", 2);
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 1 });
    // Our append has taken seq 2 and waits for the group commit (a microtask away) when the other
    // process, reading the file, appends its own seq 2.
    const ours = store.append("s1", [{ type: "steer" }]);
    const behind = store.append("s1", [{ type: "agent_done" }]);
    expect(seedAppend(live, "s1", { type: "variant_mounted", variant: 1 }).seq).toBe(2);
    const refusal = { code: "unavailable", reason: "APPEND_OVERTAKEN", options: { retryAfterMs: APPEND_OVERTAKEN_RETRY_MS }, details: { sessionId: "s1" } };
    await Promise.all([expect(ours).rejects.toMatchObject(refusal), expect(behind).rejects.toMatchObject(refusal)]);
    const retried = await store.append("s1", [{ type: "steer" }]);
    expect(retried.firstSeq).toBe(3);
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2, 3]);
    const seen: number[] = [];
    for await (const item of watcher) {
      if (item.kind === "entry") seen.push(item.entry.seq);
      if (seen.length === 2) break;
    }
    expect(seen).toEqual([2, 3]);
  });

  /**
   * An io whose next write lets another process's append land right before it and/or right after
   * it: the one span no check can close, between two adjacent system calls of ours.
   */
  function racingIo(onWrite: { before?: () => void; after?: () => void }) {
    let armed = false;
    const io: CommitIo = {
      write(fd, data, offset, length) {
        if (!armed) return nodeCommitIo.write(fd, data, offset, length);
        armed = false;
        onWrite.before?.();
        const written = nodeCommitIo.write(fd, data, offset, length);
        onWrite.after?.();
        return written;
      },
      fdatasync: (fd) => nodeCommitIo.fdatasync(fd),
    };
    return { io, arm: () => (armed = true) };
  }

  it("refuses an append another process's line got in front of between the check and the write, leaving no line of it", async () => {
    const racing = racingIo({ before: () => seedAppend(live, "s1", { type: "variant_mounted", variant: 1 }) });
    const store = open({ dir: live.dir, io: racing.io });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    racing.arm();
    await expect(store.append("s1", [{ type: "steer" }, { type: "agent_done" }])).rejects.toMatchObject({
      code: "unavailable",
      reason: "APPEND_OVERTAKEN",
      details: { sessionId: "s1" },
    });
    // The other process's seq 2 stands; ours (2 and 3) are blank lines now, which every reader skips.
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2]);
    const text = fs.readFileSync(journal("s1", live.dir), "utf8");
    expect(text).not.toMatch(/steer|agent_done/);
    expect(text.split("\n").filter((line) => line !== "" && line.trim() === "")).toHaveLength(2);
    expect(seedReadState(live, "s1").nextSeq).toBe(3);
    const retried = await store.append("s1", [{ type: "steer" }]);
    expect(retried).toMatchObject({ firstSeq: 3, snapshot: { renderState: "mounted", phase: "steer_requested" } });
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2, 3]);
    const reopened = open({ dir: live.dir });
    await store.close();
    expect(reopened.getSnapshot("s1")).toMatchObject({ lastSeq: 3, snapshot: { phase: "steer_requested", diagnostics: [] } });
  });

  it("undoes its bytes in place, never cutting the file: the other process's line written after them stays", async () => {
    const racing = racingIo({
      before: () => seedAppend(live, "s1", { type: "variant_mounted", variant: 1 }),
      after: () => seedAppend(live, "s1", { type: "variant_mounted", variant: 2 }),
    });
    const store = open({ dir: live.dir, io: racing.io });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    racing.arm();
    await expect(store.append("s1", [{ type: "steer" }])).rejects.toMatchObject({ code: "unavailable", reason: "APPEND_OVERTAKEN" });
    // The line after ours read the journal with our line in it, so took seq 3.
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2, 3]);
    expect(fs.readFileSync(journal("s1", live.dir), "utf8")).not.toMatch(/steer/);
    expect((await store.append("s1", [{ type: "steer" }])).firstSeq).toBe(4);
    expect(store.getSnapshot("s1")!.snapshot.mountedVariants).toEqual([1, 2]);
  });

  it("refuses as a seq conflict (look before writing again) an append whose split write it could not undo", async () => {
    let armed = false;
    // A short write: half the bytes, another process's line, then the rest.
    const io: CommitIo = {
      write(fd, data, offset, length) {
        if (!armed) return nodeCommitIo.write(fd, data, offset, length);
        armed = false;
        const half = Math.floor(length / 2);
        const first = nodeCommitIo.write(fd, data, offset, half);
        seedAppend(live, "s1", { type: "variant_mounted", variant: 1 });
        return first + nodeCommitIo.write(fd, data, offset + first, length - first);
      },
      fdatasync: (fd) => nodeCommitIo.fdatasync(fd),
    };
    const store = open({ dir: live.dir, io });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    armed = true;
    const refused = await expectBerthError(store.append("s1", [{ type: "steer" }]), "aborted", "SEQ_CONFLICT");
    // The journal as it is now: the two halves are no lines a reader can take.
    expect(refused.details).toMatchObject({ sessionId: "s1", currentSeq: 1 });
    expect(refused.options.retryAfterMs).toBeUndefined();
  });

  it("keeps an append another process's line followed rather than overtook", async () => {
    const racing = racingIo({ after: () => seedAppend(live, "s1", { type: "variant_mounted", variant: 1 }) });
    const store = open({ dir: live.dir, io: racing.io });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    racing.arm();
    expect(await store.append("s1", [{ type: "agent_done" }])).toMatchObject({ firstSeq: 2, lastSeq: 2 });
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2, 3]);
    expect(store.getSnapshot("s1")).toMatchObject({ lastSeq: 3, snapshot: { renderState: "mounted" } });
    expect((await store.append("s1", [{ type: "steer" }])).firstSeq).toBe(4);
  });

  /** The session's snapshot as a fresh replay of its journal gives it (no snapshot file). */
  async function replayed(id: string, root: string): Promise<SessionSnapshot> {
    const copy = fs.mkdtempSync(path.join(dir, "replay-"));
    fs.copyFileSync(journal(id, root), journal(id, copy));
    const store = createSessionStore({ dir: copy, clock, fsync: "none" });
    const snapshot = store.getSnapshot(id, { includeCompleted: true })!.snapshot;
    await store.close();
    return snapshot;
  }

  it("counts every diagnostic after a hand-off: a diagnosticsTotal another process carried past entries of its own is recounted", async () => {
    const store = open({ dir: live.dir });
    await store.append(
      "s1",
      Array.from({ length: 120 }, (_, n) => ({ type: "mystery", n })),
    );
    await store.close(); // berth's snapshot file: 100 diagnostics kept, 120 counted
    // A seed process hydrates from it, appends 10 more and writes its own snapshot file: 110
    // diagnostics, and the count of 120 it read, untouched.
    for (let n = 120; n < 130; n++) seedAppend(live, "s1", { type: "mystery", n }, { snapshotFile: true });
    expect(JSON.parse(fs.readFileSync(path.join(live.dir, "s1.snapshot.json"), "utf8"))).toMatchObject({ diagnosticsTotal: 120 });

    const restarted = open({ dir: live.dir });
    const view = restarted.getSnapshot("s1")!;
    expect(view.snapshot.diagnosticsTotal).toBe(130);
    expect(view.snapshot.diagnostics).toHaveLength(100);
    expect(view.snapshot).toEqual(await replayed("s1", live.dir));
    const next = await restarted.append("s1", [{ type: "mystery", n: 130 }]);
    expect(next.snapshot.diagnosticsTotal).toBe(131);
    expect(next.snapshot).toEqual(await replayed("s1", live.dir));
  });

  it("serves the newest 100 diagnostics of a snapshot file another process wrote with more", async () => {
    for (let n = 0; n < 147; n++) seedAppend(live, "s1", { type: "mystery", n }, { snapshotFile: n === 146 });
    expect(JSON.parse(fs.readFileSync(path.join(live.dir, "s1.snapshot.json"), "utf8")).diagnostics).toHaveLength(147);
    const store = open({ dir: live.dir });
    const view = store.getSnapshot("s1")!;
    expect(store.stats().hydrations).toBe(1);
    expect(view.snapshot.diagnostics).toHaveLength(100);
    expect(view.snapshot.diagnostics[0]).toMatchObject({ error: "unknown_event_type" });
    expect(view.snapshot.diagnosticsTotal).toBe(147);
    expect(view.snapshot).toEqual(await replayed("s1", live.dir));
  });

  it("hands watchers what another process appends as it lands, with no call touching the session", async () => {
    const store = open({ dir: live.dir });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    const watcher = store.watch("s1", 2, { includeSnapshot: true });
    const everySession = store.watchAll();
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 1 });
    // Another process appending on its own, as a seed process sharing the live directory does.
    seedAppend(live, "s1", { type: "agent_done" }, { snapshotFile: true });
    expect((await watcher.next()).value).toMatchObject({ kind: "entry", entry: { seq: 2, type: "agent_done" }, snapshot: { phase: "variants_ready" } });
    expect((await everySession.next()).value).toMatchObject({ sessionId: "s1", firstSeq: 2, lastSeq: 2 });
    // A session another process creates while it is watched: its watcher reads it from the journal.
    const fresh = store.watch("s2", 1);
    expect((await fresh.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 0 });
    seedAppend(live, "s2", { type: "generate", count: 1 }, { snapshotFile: true });
    await expect(fresh.next()).rejects.toMatchObject({ code: "resource_exhausted", details: { sessionId: "s2", lastSeq: 0 } });
    expect(store.getSnapshot("s2")!.lastSeq).toBe(1);
  });

  it("ends the watchers, resumably, when another process's change needs a full replay: none misses an entry", async () => {
    const store = open({ dir: live.dir });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    const watcher = store.watch("s1", 1);
    const everySession = store.watchAll();
    const first = await watcher.next();
    expect(first.value).toMatchObject({ kind: "entry", entry: { seq: 1 } });
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 1 });
    // A line that does not parse, then a good one: only a full replay applies them the seed's way.
    fs.appendFileSync(journal("s1", live.dir), `{"seq":2,"torn\n${seedLine(3, "s1", { type: "agent_done" })}`);
    expect(store.getSnapshot("s1")!.lastSeq).toBe(3);
    expect(store.stats().replays).toBe(1);
    const lagged = { code: "resource_exhausted", details: { sessionId: "s1", lastSeq: 1 } };
    await expect(watcher.next()).rejects.toMatchObject(lagged);
    await expect(everySession.next()).rejects.toMatchObject({ code: "resource_exhausted" });
    // Resumed where it was cut off, the watcher reads what the change brought from the journal.
    const resumed = store.watch("s1", 2);
    const seen: unknown[] = [];
    for await (const item of resumed) {
      seen.push(item.kind === "entry" ? item.entry.seq : item.kind);
      if (item.kind === "caught_up") break;
    }
    expect(seen).toEqual([3, "caught_up"]);
  });
});
