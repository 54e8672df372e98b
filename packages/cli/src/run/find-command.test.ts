import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "../command.js";
import { findCommand, spawnProblem } from "./find-command.js";

let root: string;
let bin: string;
let other: string;

beforeAll(() => {
  root = mkdtempSync(path.join(tmpdir(), "berth-find-command-"));
  bin = path.join(root, "bin");
  other = path.join(root, "other");
  mkdirSync(bin);
  mkdirSync(other);
  mkdirSync(path.join(bin, "a-directory"));
  writeFileSync(path.join(bin, "tool"), "#!/bin/sh\n", { mode: 0o755 });
  writeFileSync(path.join(bin, "plain"), "#!/bin/sh\n", { mode: 0o644 });
  // "plain" is executable further along PATH; "mixed" is not, anywhere.
  writeFileSync(path.join(other, "plain"), "#!/bin/sh\n", { mode: 0o755 });
  writeFileSync(path.join(other, "mixed"), "#!/bin/sh\n", { mode: 0o600 });
  mkdirSync(path.join(root, "tools"));
  writeFileSync(path.join(root, "tools", "run.sh"), "#!/bin/sh\n", { mode: 0o755 });
  writeFileSync(path.join(root, "tools", "data.txt"), "", { mode: 0o644 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const lookUp = (name: string, searchPath: string | undefined, cwd = root) => findCommand(name, { path: searchPath, cwd });

describe("findCommand", () => {
  it("finds an executable on PATH, the first one in PATH's order", () => {
    expect(lookUp("tool", `${other}:${bin}`)).toEqual({ file: path.join(bin, "tool") });
    expect(lookUp("plain", `${bin}:${other}`)).toEqual({ file: path.join(other, "plain") });
  });

  it("says 'command not found' (127) for a name on no PATH entry", () => {
    expect(lookUp("no-such-cmd", `${bin}:${other}`)).toEqual({
      problem: { exit: EXIT.commandNotFound, code: "command_not_found", message: "command not found: no-such-cmd" },
    });
  });

  it("passes over directories on PATH, as a shell does", () => {
    expect(lookUp("a-directory", bin).problem).toMatchObject({ exit: EXIT.commandNotFound, message: "command not found: a-directory" });
  });

  it("names a file found without the execute permission (126) when nothing runnable is found", () => {
    expect(lookUp("mixed", `${bin}:${other}`).problem).toEqual({
      exit: EXIT.cannotRun,
      code: "cannot_run",
      message: `cannot run mixed: ${path.join(other, "mixed")} is not executable (no execute permission)`,
    });
  });

  it("reads an empty PATH entry as the current directory, wherever it stands", () => {
    for (const searchPath of [`:${other}`, `${other}:`, `${other}::${bin}`, ""]) {
      expect(lookUp("tool", searchPath, bin), JSON.stringify(searchPath)).toEqual({ file: path.join(bin, "tool") });
    }
    expect(lookUp("tool", other, bin).problem?.exit).toBe(EXIT.commandNotFound);
  });

  it("searches the default path when PATH is unset", () => {
    expect(lookUp("sh", undefined).file).toMatch(/^\/(usr\/)?bin\/sh$/);
  });

  it("takes a name with a slash as a path from the current directory, and does not search PATH for it", () => {
    expect(lookUp("tools/run.sh", bin)).toEqual({ file: path.join(root, "tools", "run.sh") });
    expect(lookUp("./tools/run.sh", bin)).toEqual({ file: path.join(root, "tools", "run.sh") });
    expect(lookUp("../tools/run.sh", "", bin)).toEqual({ file: path.join(root, "tools", "run.sh") });
    expect(lookUp(path.join(bin, "tool"), "")).toEqual({ file: path.join(bin, "tool") });
    // On PATH, but a path is not looked for there.
    expect(lookUp("./tool", bin).problem).toEqual({
      exit: EXIT.commandNotFound,
      code: "command_not_found",
      message: "command not found: ./tool (no such file)",
    });
  });

  it("says why a path cannot be run (126): a directory, a file without the execute permission", () => {
    expect(lookUp("tools/data.txt", "").problem).toEqual({
      exit: EXIT.cannotRun,
      code: "cannot_run",
      message: "cannot run tools/data.txt: it is not executable (no execute permission)",
    });
    expect(lookUp("./tools", "").problem).toEqual({ exit: EXIT.cannotRun, code: "cannot_run", message: "cannot run ./tools: it is a directory" });
    expect(lookUp("tools/run.sh/x", "").problem?.exit).toBe(EXIT.commandNotFound);
  });
});

describe("spawnProblem", () => {
  const errno = (code: string, errno: number) => Object.assign(new Error(`spawn x ${code}`), { code, errno, syscall: "spawn x" });

  it("says what a failed spawn means in words, not its errno text", () => {
    expect(spawnProblem("x", errno("ENOENT", -2))).toEqual({
      exit: EXIT.commandNotFound,
      code: "command_not_found",
      message: "command not found: x (no such file or directory)",
    });
    expect(spawnProblem("x", errno("EACCES", -13))).toEqual({ exit: EXIT.cannotRun, code: "cannot_run", message: "cannot run x: permission denied" });
  });
});
