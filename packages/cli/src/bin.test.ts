import { execFileSync } from "node:child_process";
import { readFileSync, statSync } from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const cliDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const repo = path.resolve(cliDir, "../..");

describe("the berth bin", () => {
  // npm links bins when it installs, before `prepare` builds dist/: a bin under dist/ is not linked
  // on a fresh clone's first install, and `npx berth` then says it cannot find the executable.
  it("is a committed, executable file outside dist/, named alike in package.json and the lock file", () => {
    const manifest = JSON.parse(readFileSync(path.join(cliDir, "package.json"), "utf8")) as { bin: Record<string, string> };
    const bin = manifest.bin["berth"]!;
    expect(bin).not.toMatch(/dist\//);
    const file = path.join(cliDir, bin);
    expect(readFileSync(file, "utf8")).toMatch(/^#!\/usr\/bin\/env node\n/);
    expect(statSync(file).mode & 0o111).not.toBe(0);
    const tracked = execFileSync("git", ["ls-files", "--error-unmatch", path.relative(repo, file)], { cwd: repo, encoding: "utf8" });
    expect(tracked.trim()).toBe(path.relative(repo, file));
    const lock = JSON.parse(readFileSync(path.join(repo, "package-lock.json"), "utf8")) as { packages: Record<string, { bin?: Record<string, string> }> };
    expect(path.normalize(lock.packages["packages/cli"]!.bin!["berth"]!)).toBe(path.normalize(bin));
  });

  it("runs the built command", () => {
    const out = execFileSync(process.execPath, [path.join(cliDir, "bin/berth.js"), "--version"], { encoding: "utf8" });
    expect(out).toMatch(/^berth \d+\.\d+\.\d+/);
  });
});
