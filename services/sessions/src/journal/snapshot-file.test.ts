import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { baseSnapshot, sessionReducer as reducer } from "../reducer.js";
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
    expect(decodeSnapshotFile(text, "s1", 120, reducer)).toEqual({ snapshot, nextSeq: 4 });
    expect(decodeSnapshotFile(text, "s1", 121, reducer)).toBeNull();
    expect(decodeSnapshotFile(text, "s2", 120, reducer)).toBeNull();
    expect(decodeSnapshotFile(text.slice(0, 40), "s1", 120, reducer)).toBeNull();
    expect(decodeSnapshotFile(JSON.stringify({ ...snapshot, __journalBytes: 120, __nextSeq: 1.5 }), "s1", 120, reducer)).toBeNull();
  });

  it("reads the seed's pretty-printed files and lays them over the base snapshot", () => {
    const { pageUrl: _dropped, ...older } = snapshot;
    const seedText = `${JSON.stringify({ ...older, __journalBytes: 7, __nextSeq: 2 }, null, 2)}\n`;
    const decoded = decodeSnapshotFile(seedText, "s1", 7, reducer)!;
    expect(decoded.snapshot.pageUrl).toBeNull();
    expect(Object.keys(decoded.snapshot)).toEqual(Object.keys(baseSnapshot("s1")));
  });

  it("are replaced atomically and read back", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-snap-"));
    const file = path.join(dir, "s1.snapshot.json");
    await writeSnapshotFile(file, snapshot, { journalBytes: 10, nextSeq: 2 });
    await writeSnapshotFile(file, { ...snapshot, phase: "completed" }, { journalBytes: 20, nextSeq: 3 });
    expect(fs.readdirSync(dir).sort()).toEqual(["s1.snapshot.json", "s1.snapshot.meta.json"]);
    expect(readSnapshotFile(file, "s1", 20, reducer)?.snapshot.phase).toBe("completed");
    expect(readSnapshotFile(file, "s1", 10, reducer)).toBeNull();
    expect(readSnapshotFile(path.join(dir, "none.json"), "s1", 10, reducer)).toBeNull();
    expect((fs.statSync(file).mode & 0o777).toString(8)).toBe("600");
  });

  it("describe a journal's prefix through their sidecar, only while the file is the one the sidecar names", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-snap-"));
    const file = path.join(dir, "s1.snapshot.json");
    expect(sidecarPath(file)).toBe(path.join(dir, "s1.snapshot.meta.json"));
    await writeSnapshotFile(file, snapshot, { journalBytes: 100, nextSeq: 5, lastLineCrc: 1234 });
    expect(readPrefixSnapshot(file, "s1", 150, reducer)).toEqual({ snapshot, nextSeq: 5, journalBytes: 100, lastLineCrc: 1234 });
    // Current (the exact match is the other path), shorter journal, other session: no prefix.
    expect(readPrefixSnapshot(file, "s1", 100, reducer)).toBeNull();
    expect(readPrefixSnapshot(file, "s1", 90, reducer)).toBeNull();
    expect(readPrefixSnapshot(file, "s2", 150, reducer)).toBeNull();
    // The seed rewrote the snapshot file (recording the same journal length or not): the sidecar no longer names it.
    fs.writeFileSync(file, JSON.stringify({ ...snapshot, __journalBytes: 100, __nextSeq: 5 }, null, 2));
    expect(readPrefixSnapshot(file, "s1", 150, reducer)).toBeNull();
    // Without a last-line checksum the sidecar vouches for no prefix (only for the file itself).
    await writeSnapshotFile(file, snapshot, { journalBytes: 100, nextSeq: 5 });
    expect(JSON.parse(fs.readFileSync(sidecarPath(file), "utf8"))).toMatchObject({ journalBytes: 100, lastLineCrc: null });
    expect(readPrefixSnapshot(file, "s1", 150, reducer)).toBeNull();
    expect(readSnapshotFile(file, "s1", 100, reducer)).toEqual({ snapshot, nextSeq: 5 });
  });

  it("give back what berth wrote exactly, numbers JSON cannot hold included", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-snap-"));
    const file = path.join(dir, "s1.snapshot.json");
    const odd = { ...snapshot, visibleVariant: NaN, arrivedVariants: -0, paramValues: { a: [1, Infinity], b: -Infinity, c: null } };
    await writeSnapshotFile(file, odd, { journalBytes: 100, nextSeq: 5, lastLineCrc: 7 });
    expect(JSON.parse(fs.readFileSync(file, "utf8"))).toMatchObject({
      visibleVariant: null,
      arrivedVariants: 0,
      paramValues: { a: [1, null], b: null, c: null },
    });
    const read = readSnapshotFile(file, "s1", 100, reducer)!.snapshot;
    expect(read.visibleVariant).toBeNaN();
    expect(Object.is(read.arrivedVariants, -0)).toBe(true);
    expect(read.paramValues).toEqual({ a: [1, Infinity], b: -Infinity, c: null });
    expect(readPrefixSnapshot(file, "s1", 150, reducer)!.snapshot.visibleVariant).toBeNaN();
    // The seed rewrote the file since: what it holds is what it gets.
    fs.writeFileSync(file, JSON.stringify({ ...odd, __journalBytes: 100, __nextSeq: 5 }, null, 2));
    expect(readSnapshotFile(file, "s1", 100, reducer)!.snapshot.visibleVariant).toBeNull();
  });

  it("written by the seed's store are read with berth's bound on diagnostics, and not at all when they carry berth's count past entries of the seed's", () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-snap-"));
    const file = path.join(dir, "s1.snapshot.json");
    const diagnostics = Array.from({ length: 147 }, (_, n) => ({ error: "unknown_event_type", type: `t${n}` }));
    fs.writeFileSync(file, JSON.stringify({ ...snapshot, diagnostics, __journalBytes: 100, __nextSeq: 148 }, null, 2));
    const read = readSnapshotFile(file, "s1", 100, reducer)!.snapshot;
    expect(read.diagnostics).toEqual(diagnostics.slice(-100));
    expect(read.diagnosticsTotal).toBe(147);
    fs.writeFileSync(
      file,
      JSON.stringify({ ...snapshot, diagnostics: diagnostics.slice(-110), diagnosticsTotal: 120, __journalBytes: 100, __nextSeq: 131 }, null, 2),
    );
    expect(readSnapshotFile(file, "s1", 100, reducer)).toBeNull();
    // Under the bound and without a count: the seed's snapshot is berth's, as it is.
    fs.writeFileSync(file, JSON.stringify({ ...snapshot, diagnostics: diagnostics.slice(0, 3), __journalBytes: 100, __nextSeq: 4 }, null, 2));
    expect(readSnapshotFile(file, "s1", 100, reducer)).toEqual({ snapshot: { ...snapshot, diagnostics: diagnostics.slice(0, 3) }, nextSeq: 4 });
  });
});
