import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { fencingFilePath, fencingRecord, createFencingFile } from "./fencing-file.js";

/** The atomic writer fails as on a file system with no space left while `full.on` (the rest of the module is real). */
const full = vi.hoisted(() => ({ on: false, code: "ENOSPC" }));
vi.mock("@berth/shared/files", async (real) => {
  const files = await real<typeof import("@berth/shared/files")>();
  return {
    ...files,
    writeFileAtomicSync: (...args: Parameters<typeof files.writeFileAtomicSync>) => {
      if (full.on) throw Object.assign(new Error(`${full.code}: no space left on device, open '${args[0]}.tmp'`), { code: full.code });
      return files.writeFileAtomicSync(...args);
    },
  };
});
afterEach(() => {
  full.on = false;
  full.code = "ENOSPC";
});

let stateDir: string;
beforeEach(() => {
  stateDir = mkdtempSync(path.join(tmpdir(), "berth-fencing-"));
});
afterEach(() => rmSync(stateDir, { recursive: true, force: true }));

const ceiling = () => JSON.parse(readFileSync(fencingFilePath(stateDir), "utf8")).ceiling as number;

describe("fencing file", () => {
  it("hands out strictly increasing tokens from 1, writing once per block", () => {
    const fencing = createFencingFile(stateDir, { blockSize: 10 });
    const tokens = Array.from({ length: 25 }, () => fencing.next());
    expect(tokens).toEqual(Array.from({ length: 25 }, (_, i) => i + 1));
    // Tokens 21..25 came from the third block: the durable ceiling covers all of it.
    expect(ceiling()).toBe(31);
  });

  it("after a crash restarts above every token handed out (skipping the rest of the block)", () => {
    const crashed = createFencingFile(stateDir, { blockSize: 1000 });
    const before = Array.from({ length: 1500 }, () => crashed.next());
    // No close(): the process died here. A new run on the same state directory:
    const restarted = createFencingFile(stateDir, { blockSize: 1000 });
    const after = Array.from({ length: 5 }, () => restarted.next());
    expect(after[0]!).toBeGreaterThan(Math.max(...before));
    expect(after[0]).toBe(2001);
    expect(after).toEqual([2001, 2002, 2003, 2004, 2005]);
  });

  it("after a clean close continues without a gap", () => {
    const first = createFencingFile(stateDir);
    for (let i = 0; i < 7; i++) first.next();
    first.close();
    first.close();
    expect(ceiling()).toBe(8);
    const second = createFencingFile(stateDir);
    expect(second.peek()).toBe(8);
    expect(second.next()).toBe(8);
  });

  it("survives many crash/restart cycles still rising", () => {
    let last = 0;
    for (let run = 0; run < 20; run++) {
      const fencing = createFencingFile(stateDir, { blockSize: 3 });
      for (let i = 0; i < run % 5; i++) {
        const token = fencing.next();
        expect(token).toBeGreaterThan(last);
        last = token;
      }
      if (run % 2 === 0) fencing.close();
    }
  });

  it("refuses to start on a damaged file instead of guessing", () => {
    createFencingFile(stateDir).next();
    writeFileSync(fencingFilePath(stateDir), "{not json");
    expect(() => createFencingFile(stateDir)).toThrow(expect.objectContaining({ code: "internal", message: expect.stringContaining("is damaged") }));
    writeFileSync(fencingFilePath(stateDir), JSON.stringify({ version: 1, ceiling: -3 }));
    expect(() => createFencingFile(stateDir)).toThrow(/is damaged/);
  });

  it("on a full disk overwrites its fixed-length record in place, so locks go on being granted", () => {
    const fencing = createFencingFile(stateDir, { blockSize: 2 });
    expect([fencing.next(), fencing.next()]).toEqual([1, 2]);
    expect(readFileSync(fencingFilePath(stateDir), "utf8")).toBe(fencingRecord(3));
    expect(fencingRecord(3)).toHaveLength(64);
    full.on = true;
    expect([fencing.next(), fencing.next(), fencing.next()]).toEqual([3, 4, 5]);
    expect(readFileSync(fencingFilePath(stateDir), "utf8")).toBe(fencingRecord(7));
    full.on = false;
    fencing.next();
    expect(ceiling()).toBe(7);
  });

  it("says DISK_FULL or STATE_READ_ONLY, naming the state directory, when the record cannot be written at all", () => {
    full.on = true;
    const fresh = createFencingFile(stateDir);
    expect(() => fresh.next()).toThrow(
      expect.objectContaining({
        code: "resource_exhausted",
        reason: "DISK_FULL",
        message: expect.stringContaining(`the file system of the state directory ${stateDir} is full (ENOSPC)`),
      }),
    );
    full.code = "EROFS";
    expect(() => fresh.next()).toThrow(
      expect.objectContaining({ code: "unavailable", reason: "STATE_READ_ONLY", message: expect.stringContaining("mounted read-only") }),
    );
    full.on = false;
    expect(fresh.next()).toBe(1);
  });
});
