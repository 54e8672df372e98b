import { spawn } from "node:child_process";
import { closeSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { confirmStillWritable, ensurePrivateDir, fsyncDirectory, statOrNull, writeFileAtomic, writeFileAtomicSync } from "./files.js";
import { transpileForChild, type ChildModules } from "./testing/child-modules.js";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(path.join(tmpdir(), "berth-files-"));
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

const mode = (file: string) => statSync(file).mode & 0o777;
const leftovers = (d: string) => readdirSync(d).filter((name) => name.endsWith(".tmp"));

describe("writeFileAtomicSync", () => {
  it("creates a private file and replaces it whole", () => {
    const target = path.join(dir, "state.json");
    writeFileAtomicSync(target, '{"v":1}');
    expect(readFileSync(target, "utf8")).toBe('{"v":1}');
    expect(mode(target)).toBe(0o600);
    writeFileAtomicSync(target, new Uint8Array([1, 2, 3]));
    expect([...readFileSync(target)]).toEqual([1, 2, 3]);
    expect(leftovers(dir)).toEqual([]);
  });

  it("takes another mode", () => {
    const target = path.join(dir, "shared.txt");
    writeFileAtomicSync(target, "x", { mode: 0o640 });
    expect(mode(target)).toBe(0o640);
  });

  it("removes its temp file and leaves the target alone when the rename fails", () => {
    const target = path.join(dir, "a-directory");
    mkdirSync(target);
    expect(() => writeFileAtomicSync(target, "data")).toThrow();
    expect(statSync(target).isDirectory()).toBe(true);
    expect(leftovers(dir)).toEqual([]);
  });

  it("fails cleanly when the directory does not exist", () => {
    expect(() => writeFileAtomicSync(path.join(dir, "missing", "x"), "data")).toThrow(/ENOENT/);
  });
});

describe("writeFileAtomic", () => {
  it("creates a private file and replaces it whole", async () => {
    const target = path.join(dir, "async.json");
    await writeFileAtomic(target, "first");
    await writeFileAtomic(target, Buffer.from("second"));
    expect(readFileSync(target, "utf8")).toBe("second");
    expect(mode(target)).toBe(0o600);
    expect(leftovers(dir)).toEqual([]);
  });

  it("removes its temp file when the rename fails", async () => {
    const target = path.join(dir, "another-directory");
    mkdirSync(target);
    await expect(writeFileAtomic(target, "data")).rejects.toThrow();
    expect(leftovers(dir)).toEqual([]);
  });
});

describe("the small helpers", () => {
  it("statOrNull gives null for what is not there", () => {
    expect(statOrNull(path.join(dir, "nothing"))).toBeNull();
    expect(statOrNull(path.join(dir, "state.json", "below-a-file"))).toBeNull();
    writeFileSync(path.join(dir, "there"), "abc");
    expect(statOrNull(path.join(dir, "there"))?.size).toBe(3);
  });

  it("ensurePrivateDir creates nested 0700 directories and accepts existing ones", () => {
    const nested = path.join(dir, "p", "q");
    ensurePrivateDir(nested);
    ensurePrivateDir(nested);
    expect(mode(nested)).toBe(0o700);
    expect(mode(path.join(dir, "p"))).toBe(0o700);
  });

  it("fsyncDirectory works on a directory and refuses a missing one", () => {
    fsyncDirectory(dir);
    expect(() => fsyncDirectory(path.join(dir, "nothing"))).toThrow(/ENOENT/);
  });

  it("confirmStillWritable writes nothing to a writable file, and fails where the file takes no write", () => {
    const file = path.join(dir, "journal.jsonl");
    writeFileSync(file, "one\n");
    const before = statSync(file);
    const fd = openSync(file, "a");
    try {
      confirmStillWritable(fd);
      const after = statSync(file);
      expect([after.size, after.mtimeMs]).toEqual([before.size, before.mtimeMs]);
    } finally {
      closeSync(fd);
    }
    // /dev/full refuses every write(2), even one of nothing: the probe reaches the kernel.
    const full = openSync("/dev/full", "w");
    try {
      expect(() => confirmStillWritable(full)).toThrow(expect.objectContaining({ code: "ENOSPC" }));
    } finally {
      closeSync(full);
    }
  });
});

describe("a writer killed mid-way", () => {
  let child: ChildModules;
  beforeAll(() => {
    child = transpileForChild(["files"]);
  });
  afterAll(() => child.remove());

  // Each version is SIZE bytes of one value; the first write completes before "ready", so from then on
  // the target must always hold one whole version.
  const SIZE = 4 * 1024 * 1024;
  const ROUNDS = 20;

  it("never leaves a partial file under the final name", async () => {
    const script = child.script(
      "writer.mjs",
      `import { writeFileAtomicSync } from ${JSON.stringify(child.url("files"))};
const [target, size] = [process.argv[2], Number(process.argv[3])];
const buffers = [1, 2, 3].map((v) => Buffer.alloc(size, v));
for (let i = 0; ; i++) {
  writeFileAtomicSync(target, buffers[i % 3]);
  if (i === 0) process.stdout.write("ready\\n");
}
`,
    );
    let killedMidWrite = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const roundDir = path.join(dir, `kill-${round}`);
      mkdirSync(roundDir);
      const target = path.join(roundDir, "big.bin");
      const writer = spawn(process.execPath, [script, target, String(SIZE)], { stdio: ["ignore", "pipe", "inherit"] });
      const exited = new Promise((resolve) => writer.on("exit", resolve));
      await new Promise<void>((resolve, reject) => {
        writer.stdout.once("data", () => resolve());
        writer.once("exit", (code) => reject(new Error(`writer exited early with ${code}`)));
      });
      // Kill points spread over 0–57 ms, the same every run.
      await new Promise((resolve) => setTimeout(resolve, (round * 23) % 60));
      writer.kill("SIGKILL");
      await exited;

      const content = readFileSync(target);
      expect(content.length).toBe(SIZE);
      const first = content[0]!;
      expect([1, 2, 3]).toContain(first);
      expect(content.every((byte) => byte === first)).toBe(true);
      if (leftovers(roundDir).length > 0) killedMidWrite++;
      rmSync(roundDir, { recursive: true, force: true });
    }
    // Proof the test exercised what it claims: some kills landed while a temp file was being written.
    expect(killedMidWrite).toBeGreaterThan(0);
  }, 120_000);
});
