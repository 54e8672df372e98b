import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import * as os from "node:os";
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

  // Start-up is what a command loads: --help no networking at all; a command that makes one call
  // over HTTP/1.1 neither undici (behind the global Headers) nor http2, https and TLS.
  it("loads only what the command needs", () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "berth-bin-"));
    try {
      const list = path.join(dir, "loaded");
      const preload = path.join(dir, "record.cjs");
      writeFileSync(preload, `process.on("exit", () => require("node:fs").writeFileSync(${JSON.stringify(list)}, process.moduleLoadList.join("\\n")));`);
      const loaded = (...args: string[]): string[] => {
        try {
          execFileSync(process.execPath, ["-r", preload, path.join(cliDir, "bin/berth.js"), ...args], {
            // Nothing listens on port 1: the call is made and refused, which is enough to load its code.
            env: { ...process.env, BERTH_SESSIONS_URL: "http://127.0.0.1:1", BERTH_BUDGET_URL: "http://127.0.0.1:1" },
            stdio: "ignore",
          });
        } catch {
          // the refused call's exit code
        }
        return readFileSync(list, "utf8")
          .split("\n")
          .filter((m) => m.startsWith("NativeModule "))
          .map((m) => m.slice("NativeModule ".length));
      };
      expect(loaded("--help").filter((m) => /^(net|http|http2|https|tls|zlib|internal\/deps\/undici)/.test(m))).toEqual([]);
      for (const command of [
        ["sessions", "list"],
        ["lock", "inspect", "x"],
        ["budget", "state"],
      ]) {
        const modules = loaded(...command);
        expect(modules, command.join(" ")).toContain("http");
        // On every Node: on 22 and later, importing `node:http` as a namespace alone loads undici
        // (its WebSocket getters), which the bundle avoids by requiring it (scripts/bundle.mjs).
        expect(
          modules.filter((m) => /^(http2|https|tls|crypto|internal\/deps\/undici)/.test(m)),
          command.join(" "),
        ).toEqual([]);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
