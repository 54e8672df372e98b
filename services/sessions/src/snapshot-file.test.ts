import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { baseSnapshot } from "./reducer.js";
import { decodeSnapshotFile, encodeSnapshotFile, readPrefixSnapshot, readSnapshotFile, sidecarPath, writeSnapshotFile } from "./snapshot-file.js";

let dir: string | undefined;
afterEach(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

describe("snapshot files", () => {
  const snapshot = { ...baseSnapshot("s1"), phase: "steer_requested" };

  it("round-trips only at the journal size they were written for", () => {
    const text = encodeSnapshotFile(snapshot, { journalBytes: 120, nextSeq: 4 });
    expect(JSON.parse(text)).toMatchObject({ __journalBytes: 120, __nextSeq: 4, phase: "steer_requested" });
    expect(decodeSnapshotFile(text, "s1", 120)).toEqual({ snapshot, nextSeq: 4 });
    expect(decodeSnapshotFile(text, "s1", 121)).toBeNull();
    expect(decodeSnapshotFile(text, "s2", 120)).toBeNull();
    expect(decodeSnapshotFile(text.slice(0, 40), "s1", 120)).toBeNull();
    expect(decodeSnapshotFile(JSON.stringify({ ...snapshot, __journalBytes: 120, __nextSeq: 1.5 }), "s1", 120)).toBeNull();
  });

  it("reads the seed's pretty-printed files and lays them over the base snapshot", () => {
    const { pageUrl: _dropped, ...older } = snapshot;
    const seedText = JSON.stringify({ ...older, __journalBytes: 7, __nextSeq: 2 }, null, 2) + "\n";
    const decoded = decodeSnapshotFile(seedText, "s1", 7)!;
    expect(decoded.snapshot.pageUrl).toBeNull();
    expect(Object.keys(decoded.snapshot)).toEqual(Object.keys(baseSnapshot("s1")));
  });

  it("are replaced atomically and read back", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-snap-"));
    const file = path.join(dir, "s1.snapshot.json");
    await writeSnapshotFile(file, snapshot, { journalBytes: 10, nextSeq: 2 });
    await writeSnapshotFile(file, { ...snapshot, phase: "completed" }, { journalBytes: 20, nextSeq: 3 });
    expect(fs.readdirSync(dir)).toEqual(["s1.snapshot.json"]);
    expect(readSnapshotFile(file, "s1", 20)?.snapshot.phase).toBe("completed");
    expect(readSnapshotFile(file, "s1", 10)).toBeNull();
    expect(readSnapshotFile(path.join(dir, "none.json"), "s1", 10)).toBeNull();
    expect((fs.statSync(file).mode & 0o777).toString(8)).toBe("600");
  });

  it("describe a journal's prefix through their sidecar, only while the file is the one the sidecar names", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-snap-"));
    const file = path.join(dir, "s1.snapshot.json");
    expect(sidecarPath(file)).toBe(path.join(dir, "s1.snapshot.meta.json"));
    await writeSnapshotFile(file, snapshot, { journalBytes: 100, nextSeq: 5, lastLineCrc: 1234 });
    expect(readPrefixSnapshot(file, "s1", 150)).toEqual({ snapshot, nextSeq: 5, journalBytes: 100, lastLineCrc: 1234 });
    // Current (the exact match is the other path), shorter journal, other session: no prefix.
    expect(readPrefixSnapshot(file, "s1", 100)).toBeNull();
    expect(readPrefixSnapshot(file, "s1", 90)).toBeNull();
    expect(readPrefixSnapshot(file, "s2", 150)).toBeNull();
    // The seed rewrote the snapshot file (same size fence or not): the sidecar no longer names it.
    fs.writeFileSync(file, JSON.stringify({ ...snapshot, __journalBytes: 100, __nextSeq: 5 }, null, 2));
    expect(readPrefixSnapshot(file, "s1", 150)).toBeNull();
    // Without a last-line checksum no sidecar is written: nothing to vouch for the prefix.
    fs.rmSync(sidecarPath(file));
    await writeSnapshotFile(file, snapshot, { journalBytes: 100, nextSeq: 5 });
    expect(fs.existsSync(sidecarPath(file))).toBe(false);
    expect(readPrefixSnapshot(file, "s1", 150)).toBeNull();
  });
});
