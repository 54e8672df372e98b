import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { BerthError } from "@berth/shared/errors";
import { canonicalLockPath, canonicalPath } from "./lock-path.js";

let root: string;
/** `<root>/real/src`, a real directory with `x/` in it; `<root>/link` → `<root>/real`. */
let real: string;
let link: string;

beforeEach(() => {
  // The temp directory itself may sit behind a symlink: every expectation is built from its real path.
  root = fs.realpathSync(fs.mkdtempSync(path.join(tmpdir(), "berth-lockpath-")));
  real = path.join(root, "real");
  link = path.join(root, "link");
  fs.mkdirSync(path.join(real, "src", "x"), { recursive: true });
  fs.symlinkSync(real, link);
});
afterEach(() => fs.rmSync(root, { recursive: true, force: true }));

function refusal(file: unknown, field?: string): BerthError {
  try {
    canonicalLockPath(file, field);
  } catch (error) {
    expect(error).toBeInstanceOf(BerthError);
    return error as BerthError;
  }
  throw new Error(`expected ${JSON.stringify(file)} to be refused`);
}

describe("canonicalLockPath", () => {
  it("gives every spelling of one file the same path: symlinked parent, '.', '..', repeated and trailing slashes", () => {
    const canonical = path.join(real, "src", "app.css");
    fs.writeFileSync(canonical, "");
    for (const spelling of [
      canonical,
      `${link}/src/app.css`,
      `${real}/src/x/../app.css`,
      `${link}/src/x/../app.css`,
      `${root}/real/./src//app.css`,
      `${link}/src/app.css/`,
      `${link}/src/app.css//`,
      `${root}/link/../link/src/app.css`,
    ]) {
      expect(canonicalLockPath(spelling), spelling).toBe(canonical);
    }
  });

  it("does not need the file to exist", () => {
    expect(canonicalLockPath(`${link}/src/new.css`)).toBe(path.join(real, "src", "new.css"));
  });

  it("appends missing parent directories as given, below the deepest one that exists", () => {
    expect(canonicalLockPath(`${link}/src/gen/deep/a.ts`)).toBe(path.join(real, "src", "gen", "deep", "a.ts"));
    // '..' below a missing name goes back up lexically, to where the real path resumes.
    expect(canonicalLockPath(`${link}/src/gen/../x/a.ts`)).toBe(path.join(real, "src", "x", "a.ts"));
    expect(canonicalLockPath(`${link}/src/gen/../../src/a.ts`)).toBe(path.join(real, "src", "a.ts"));
    // A symlinked directory after a missing one that '..' left behind is still followed.
    fs.symlinkSync(path.join(real, "src"), path.join(root, "src-link"));
    expect(canonicalLockPath(`${root}/gone/../src-link/gen/a.ts`)).toBe(path.join(real, "src", "gen", "a.ts"));
  });

  it("takes '..' after a symlinked directory physically, as the kernel does", () => {
    fs.symlinkSync(path.join(real, "src", "x"), path.join(root, "x-link"));
    // root/x-link/.. is real/src (the target's parent), not root.
    expect(canonicalLockPath(`${root}/x-link/../app.css`)).toBe(path.join(real, "src", "app.css"));
    expect(canonicalLockPath(`${root}/x-link/../gen/app.css`)).toBe(path.join(real, "src", "gen", "app.css"));
  });

  it("stops '..' at the root", () => {
    expect(canonicalLockPath("/../../berth-no-such-dir/a")).toBe("/berth-no-such-dir/a");
    expect(canonicalLockPath(`/../..${real}/src/a`)).toBe(path.join(real, "src", "a"));
    expect(canonicalPath("/..")).toBe("/");
  });

  it("never follows the last name, even a symlink: the lock names a name in a directory", () => {
    fs.writeFileSync(path.join(real, "src", "target.css"), "");
    fs.symlinkSync("target.css", path.join(real, "src", "alias.css"));
    expect(canonicalLockPath(`${link}/src/alias.css`)).toBe(path.join(real, "src", "alias.css"));
    fs.symlinkSync(path.join(root, "nowhere"), path.join(real, "src", "dangling.css"));
    expect(canonicalLockPath(`${link}/src/dangling.css`)).toBe(path.join(real, "src", "dangling.css"));
  });

  it("resolves a path whose last name is '.' or '..' as the directory it names", () => {
    expect(canonicalLockPath(`${link}/src/x/..`)).toBe(path.join(real, "src"));
    expect(canonicalLockPath(`${link}/.`)).toBe(real);
  });

  it("keeps a dangling symlinked directory's name, and what is below it, as given", () => {
    fs.symlinkSync(path.join(root, "nowhere"), path.join(root, "dangling"));
    expect(canonicalLockPath(`${root}/dangling/a/b.ts`)).toBe(path.join(root, "dangling", "a", "b.ts"));
  });

  it("treats a regular file in the middle of a path as the end of what exists", () => {
    fs.writeFileSync(path.join(real, "src", "file"), "");
    expect(canonicalLockPath(`${link}/src/file/a.ts`)).toBe(path.join(real, "src", "file", "a.ts"));
  });

  it("is its own fixed point", () => {
    for (const spelling of [`${link}/src/x/../app.css`, `${link}/src/gen/a.ts`, "/../x", `${link}/.`]) {
      const once = canonicalLockPath(spelling);
      expect(canonicalLockPath(once)).toBe(once);
    }
  });

  it("refuses a relative path naming the field and saying what to send", () => {
    for (const relative of ["src/app.css", "./app.css", "../proj/src/app.css", "~/app.css", "app.css"]) {
      const error = refusal(relative);
      expect(error.code).toBe("invalid_argument");
      expect(error.message).toBe(`file: must be an absolute path; resolve it against your working directory before sending, got ${JSON.stringify(relative)}`);
      expect(error.details).toMatchObject({ field: "file" });
    }
    expect(refusal("src/app.css", "fence.file").message).toMatch(/^fence\.file: must be an absolute path/);
  });

  it.each([
    ["empty", "", /^file: is required/],
    ["not a string", 42, /^file: is required/],
    ["NUL", "/src/a\0b.ts", /^file: must not contain a NUL byte/],
    ["over 4096 bytes", `/${"a/".repeat(2048)}`, /^file: must be at most 4096 bytes/],
    ["a name over 255 bytes", `/src/${"n".repeat(256)}.ts`, /^file: must have names of at most 255 bytes between slashes, got one of 259/],
  ])("refuses %s with invalid_argument naming the field", (_name, input, message) => {
    const error = refusal(input);
    expect(error.code).toBe("invalid_argument");
    expect(error.message).toMatch(message);
  });

  it("refuses a path that resolves through a symlink to more than 4096 bytes", () => {
    let deep = real;
    for (let i = 0; i < 16; i++) deep = path.join(deep, String(i).padStart(240, "d"));
    expect(Buffer.byteLength(deep)).toBeLessThan(4096);
    expect(Buffer.byteLength(deep) + 251).toBeGreaterThan(4096);
    fs.mkdirSync(deep, { recursive: true });
    fs.symlinkSync(deep, path.join(root, "short"));
    const input = `${root}/short/${"f".repeat(250)}`;
    expect(Buffer.byteLength(input)).toBeLessThan(4096);
    expect(refusal(input).message).toMatch(/^file: resolves to \d+ bytes .*, more than 4096$/);
  });

  it("refuses a loop of symbolic links", () => {
    fs.symlinkSync(path.join(root, "b"), path.join(root, "a"));
    fs.symlinkSync(path.join(root, "a"), path.join(root, "b"));
    const error = refusal(`${root}/a/file.ts`);
    expect(error.code).toBe("invalid_argument");
    expect(error.message).toMatch(/^file: passes through a loop of symbolic links/);
  });
});

describe("canonicalLockPath refuses what is no file of a project", () => {
  it.each([
    ["/proc/self/environ", "/proc"],
    ["/proc/1/status", "/proc"],
    ["/proc", "/proc"],
    ["/sys/kernel/mm", "/sys"],
    ["/dev/null", "/dev"],
    ["/dev/shm/berth-no-such-file", "/dev"],
    ["/dev/../proc/./self", "/proc"],
  ])("refuses %s: it resolves into %s", (file, kernel) => {
    const error = refusal(file);
    expect(error.code).toBe("invalid_argument");
    expect(error.details).toMatchObject({ field: "file" });
    expect(error.message).toContain(`resolves into ${kernel}, the kernel's file system of processes and devices, which is not lockable`);
  });

  it("refuses the root directory", () => {
    for (const root of ["/", "/..", "//", "/tmp/.."]) {
      expect(refusal(root).message, root).toMatch(/^file: names the root directory, not a file/);
    }
  });

  it("refuses a path through a symlinked directory into the kernel's file systems", () => {
    fs.symlinkSync("/proc/self", path.join(root, "me"));
    expect(refusal(`${root}/me/environ`).message).toMatch(/resolves into \/proc/);
  });

  it("refuses a last name that is a symlink into them, dangling or not, as far as a chain leads", () => {
    fs.symlinkSync("/dev/null", path.join(real, "src", "null.css"));
    expect(refusal(`${real}/src/null.css`).message).toMatch(/resolves into \/dev/);
    fs.symlinkSync("/dev/berth-no-such-device", path.join(real, "src", "dangling-dev.css"));
    expect(refusal(`${real}/src/dangling-dev.css`).message).toMatch(/resolves into \/dev/);
    fs.symlinkSync(path.join(real, "src", "dangling-dev.css"), path.join(real, "src", "chain.css"));
    expect(refusal(`${link}/src/chain.css`).message).toMatch(/resolves into \/dev/);
    fs.symlinkSync("/sys/kernel", path.join(real, "src", "sys-dir"));
    expect(refusal(`${real}/src/sys-dir`).message).toMatch(/resolves into \/sys/);
  });

  it("still locks a file whose last name is a symlink elsewhere, under its own name", () => {
    fs.writeFileSync(path.join(real, "src", "target.css"), "");
    fs.symlinkSync("target.css", path.join(real, "src", "alias.css"));
    expect(canonicalLockPath(`${real}/src/alias.css`)).toBe(path.join(real, "src", "alias.css"));
    // A name that merely starts like a kernel file system is an ordinary directory.
    expect(canonicalLockPath("/devices/a.ts")).toBe("/devices/a.ts");
    expect(canonicalLockPath("/process/a.ts")).toBe("/process/a.ts");
  });
});
