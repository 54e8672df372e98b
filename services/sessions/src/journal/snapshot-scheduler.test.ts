import { describe, expect, it, vi } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import type { FileSessionJournal } from "./file-session-journal.js";
import { CONCURRENT_SNAPSHOT_WRITES, SnapshotScheduler } from "./snapshot-scheduler.js";

/** Snapshot files being written, each finished by hand. */
const files = vi.hoisted(() => ({ writing: [] as Array<{ id: string; finish: () => void }>, most: 0 }));
vi.mock("./snapshot-file.js", () => ({
  writeSnapshotFile: (file: string) =>
    new Promise<void>((resolve) => {
      files.writing.push({ id: file, finish: resolve });
      files.most = Math.max(files.most, files.writing.length);
    }),
}));
vi.mock("./journal-file.js", () => ({ lastLineCrc: () => 0 }));

function session(id: string): FileSessionJournal {
  return {
    id,
    onDisk: true,
    fileSize: 100,
    snapshotFileBytes: -1,
    nextSeq: 2,
    snapshot: {},
    entriesSinceSnapshot: 1,
    path: `/j/${id}.jsonl`,
  } as unknown as FileSessionJournal;
}

describe("background snapshot writes", () => {
  it(`run ${CONCURRENT_SNAPSHOT_WRITES} at a time however many sessions fall due together, each session waiting its turn as writing`, async () => {
    const tracked: Array<Promise<unknown>> = [];
    const scheduler = new SnapshotScheduler({
      dir: "/j",
      clock: new ManualClock(),
      logger: undefined,
      everyEntries: 1000,
      idleMs: 5000,
      running: () => true,
      current: () => true,
      track: (work) => void tracked.push(work),
      written: () => {},
    });
    const sessions = Array.from({ length: 10 }, (_, i) => session(`s${i}`));
    for (const s of sessions) scheduler.inBackground(s, "could not write a snapshot file");
    // Every session is writing (a deletion waits for it), but only two files are open at once.
    expect(sessions.every((s) => s.snapshotWrite !== undefined)).toBe(true);
    let finished = 0;
    while (finished < sessions.length) {
      await vi.waitFor(() => expect(files.writing.length).toBeGreaterThan(0));
      expect(files.writing.length).toBeLessThanOrEqual(CONCURRENT_SNAPSHOT_WRITES);
      files.writing.shift()!.finish();
      finished++;
    }
    await Promise.all(tracked);
    expect(files.most).toBe(CONCURRENT_SNAPSHOT_WRITES);
    expect(sessions.map((s) => s.snapshotFileBytes)).toEqual(sessions.map(() => 100));
  });
});
