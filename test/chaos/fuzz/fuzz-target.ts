/**
 * A service process for the fuzzer, in a sandbox of its own: a temp directory holding its working
 * directory, its HOME, its TMPDIR and its state directory, so that anything it writes anywhere but
 * the state directory shows up. Three ways of seeing writes, from the most to the least exact:
 * - strace (when this machine lets us trace): every successful syscall that creates, writes,
 *   renames, removes or re-permissions a path, read after each batch;
 * - a snapshot of the sandbox tree (outside the state directory) before and after;
 * - the `/tmp` listing before and after, where a new name carrying the run's marker (the name the
 *   fuzzer's traversal attempts aim at) can only have come from the service.
 * Also here: journal digests (what changed in `<state>/sessions/*.jsonl` and how) and the running
 * tally of the budget, for the "a refused call changes nothing" check.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { closeSync, existsSync, lstatSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { healthCheckOnce } from "../../harness/processes.js";
import { entryPoint } from "../../harness/repo.js";

/** How a process ended. */
export interface ExitStatus {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

/** A started service in its sandbox. */
export interface FuzzTarget {
  readonly kind: "sessions" | "budget";
  /** The sandbox: `work/` (cwd), `home/` (HOME), `tmp/` (TMPDIR), `state/`. */
  readonly root: string;
  readonly stateDir: string;
  readonly workDir: string;
  readonly url: string;
  /** The service's own pid (under strace the direct child is strace). */
  readonly pid: number;
  readonly traced: boolean;
  /** The exit status once the process has exited. */
  exitStatus(): ExitStatus | undefined;
  /** Log lines at level error or above so far. */
  errorLogs(): string[];
  /** The last lines of output, for failure messages. */
  tail(): string;
  /**
   * Writes (from strace) since the previous call to a path outside the state directory, as
   * `syscall path` strings; [] when not traced. `allLockFiles` collects every `.lock` path written.
   */
  newWrites(): { outside: string[]; lockFiles: string[]; count: number };
  /** SIGTERM, then SIGKILL after `timeoutMs`. */
  stop(timeoutMs?: number): Promise<ExitStatus>;
  /** Removes the sandbox (after stop). */
  remove(): void;
}

const WRITE_SYSCALLS = [
  "open",
  "openat",
  "openat2",
  "creat",
  "mkdir",
  "mkdirat",
  "rename",
  "renameat",
  "renameat2",
  "unlink",
  "unlinkat",
  "rmdir",
  "link",
  "linkat",
  "symlink",
  "symlinkat",
  "truncate",
  "chmod",
  "fchmodat",
  "chown",
  "fchownat",
  "lchown",
  "utimensat",
  "mknod",
  "mknodat",
  "bind",
];

let straceUsable: boolean | undefined;

/** Whether strace runs here and may trace a child (ptrace can be forbidden in containers). */
export function canTrace(): boolean {
  if (straceUsable !== undefined) return straceUsable;
  const probe = spawnSync("strace", ["-f", "-qq", "--seccomp-bpf", "-e", "trace=openat", "-o", "/dev/null", "true"], { stdio: "ignore", timeout: 10_000 });
  straceUsable = probe.status === 0;
  return straceUsable;
}

/** Options of {@link startTarget}. */
export interface TargetOptions {
  readonly args?: readonly string[];
  /** Trace writes with strace when possible (default true). */
  readonly trace?: boolean;
  readonly readyTimeoutMs?: number;
}

/** Starts `kind` in a fresh sandbox and waits until health answers SERVING. */
export async function startTarget(kind: "sessions" | "budget", options: TargetOptions = {}): Promise<FuzzTarget> {
  const root = mkdtempSync(path.join(tmpdir(), "berth-fuzz-"));
  const workDir = path.join(root, "work");
  const homeDir = path.join(root, "home");
  const tmpDir = path.join(root, "tmp");
  const stateDir = path.join(root, "state");
  for (const dir of [workDir, homeDir, tmpDir]) mkdirSync(dir);
  const traceDir = path.join(root, "strace");
  const traced = options.trace !== false && canTrace();

  const entry = entryPoint(kind);
  const serviceArgs = [entry.script, ...entry.args, "--state-dir", stateDir, `--${kind}-port`, "0", "--log-level", "info", ...(options.args ?? [])];
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!name.startsWith("BERTH_") && !name.startsWith("BACKLOT_")) env[name] = value;
  }
  Object.assign(env, { HOME: homeDir, TMPDIR: tmpDir, TMP: tmpDir, TEMP: tmpDir, PWD: workDir });

  let child: ChildProcess;
  if (traced) {
    mkdirSync(traceDir);
    child = spawn(
      "strace",
      [
        "-ff",
        "-qq",
        "-z",
        "--seccomp-bpf",
        "-xx",
        "-y",
        "-s",
        "4096",
        "-e",
        `trace=${WRITE_SYSCALLS.join(",")}`,
        "-o",
        path.join(traceDir, "t"),
        "--",
        process.execPath,
        ...serviceArgs,
      ],
      { cwd: workDir, env, stdio: ["ignore", "pipe", "pipe"] },
    );
  } else {
    child = spawn(process.execPath, serviceArgs, { cwd: workDir, env, stdio: ["ignore", "pipe", "pipe"] });
  }
  const lines: string[] = [];
  const errors: string[] = [];
  let partial = "";
  let status: ExitStatus | undefined;
  let onListening: (url: string, pid: number) => void = () => {};
  const listening = new Promise<{ url: string; pid: number }>((resolve) => (onListening = (url, pid) => resolve({ url, pid })));
  child.stdout!.setEncoding("utf8");
  child.stdout!.on("data", (chunk: string) => {
    partial += chunk;
    let newline: number;
    while ((newline = partial.indexOf("\n")) >= 0) {
      const line = partial.slice(0, newline);
      partial = partial.slice(newline + 1);
      if (lines.length >= 400) lines.shift();
      lines.push(line);
      try {
        const entry = JSON.parse(line) as { level?: number; msg?: string; url?: string; pid?: number };
        if ((entry.level ?? 0) >= 50) {
          const err = (entry as { err?: { type?: string; message?: string; code?: string; stack?: string } }).err;
          errors.push(
            `${entry.msg ?? "(no msg)"}: ${err ? `${err.type ?? ""} ${err.code ?? ""} ${err.message ?? ""} | ${(err.stack ?? "").split("\n").slice(1, 6).join(" | ")}` : line.slice(0, 500)}`,
          );
        }
        if (entry.msg === "listening" && typeof entry.url === "string" && typeof entry.pid === "number") onListening(entry.url, entry.pid);
      } catch {
        // not JSON
      }
    }
  });
  let stderr = "";
  child.stderr!.setEncoding("utf8");
  child.stderr!.on("data", (chunk: string) => (stderr = (stderr + chunk).slice(-20_000)));
  const exited = new Promise<ExitStatus>((resolve) => child.once("close", (code, signal) => resolve((status = { code, signal }))));
  const tail = () => `--- stdout (last lines):\n${lines.slice(-40).join("\n")}\n--- stderr:\n${stderr.slice(-4000)}`;

  const readyTimeoutMs = options.readyTimeoutMs ?? 30_000;
  const ready = await Promise.race([
    listening,
    exited.then((s) => new Error(`${kind} exited before listening (${JSON.stringify(s)})\n${tail()}`)),
    new Promise<Error>((resolve) =>
      setTimeout(() => resolve(new Error(`${kind} was not listening within ${readyTimeoutMs} ms\n${tail()}`)), readyTimeoutMs).unref(),
    ),
  ]);
  if (ready instanceof Error) {
    child.kill("SIGKILL");
    throw ready;
  }
  const { url, pid } = ready;
  const deadline = Date.now() + readyTimeoutMs;
  while ((await healthCheckOnce(url).catch(() => "no answer")) !== "SERVING") {
    if (Date.now() > deadline || status !== undefined) {
      child.kill("SIGKILL");
      throw new Error(`${kind} listens at ${url} but health never answered SERVING\n${tail()}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }

  const traceOffsets = new Map<string, number>();
  const pendingText = new Map<string, string>();
  const resolvedState = path.resolve(stateDir);
  const isInside = (p: string, dir: string) => p === dir || p.startsWith(`${dir}/`);

  return {
    kind,
    root,
    stateDir,
    workDir,
    url,
    pid,
    traced,
    exitStatus: () => status,
    errorLogs: () => [...errors],
    tail,
    newWrites() {
      const outside: string[] = [];
      const lockFiles: string[] = [];
      let count = 0;
      if (!traced || !existsSync(traceDir)) return { outside, lockFiles, count };
      for (const name of readdirSync(traceDir)) {
        const file = path.join(traceDir, name);
        const text = readNew(file, traceOffsets);
        const buffered = (pendingText.get(file) ?? "") + text;
        const cut = buffered.lastIndexOf("\n");
        pendingText.set(file, cut < 0 ? buffered : buffered.slice(cut + 1));
        if (cut < 0) continue;
        for (const line of buffered.slice(0, cut).split("\n")) {
          for (const written of writtenPaths(line, workDir)) {
            count++;
            if (written.path.endsWith(".lock")) lockFiles.push(written.path);
            if (isInside(written.path, resolvedState) || ALWAYS_ALLOWED.has(written.path)) continue;
            outside.push(`${written.syscall} ${JSON.stringify(written.path)}`);
          }
        }
      }
      return { outside, lockFiles, count };
    },
    async stop(timeoutMs = 10_000) {
      if (status !== undefined) return status;
      signal(pid, "SIGTERM");
      const timer = setTimeout(() => {
        signal(pid, "SIGKILL");
        child.kill("SIGKILL");
      }, timeoutMs);
      const result = await exited;
      clearTimeout(timer);
      return result;
    },
    remove() {
      rmSync(root, { recursive: true, force: true });
    },
  };
}

/** Paths any process may write (the null device, its own terminal). */
const ALWAYS_ALLOWED = new Set(["/dev/null", "/dev/tty"]);

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // already gone
  }
}

/** Reads what was appended to `file` since the last call. */
function readNew(file: string, offsets: Map<string, number>): string {
  const from = offsets.get(file) ?? 0;
  let size: number;
  try {
    size = statSync(file).size;
  } catch {
    return "";
  }
  if (size <= from) return "";
  const fd = openSync(file, "r");
  try {
    const buffer = Buffer.alloc(size - from);
    const read = readSync(fd, buffer, 0, buffer.length, from);
    offsets.set(file, from + read);
    return buffer.subarray(0, read).toString("latin1");
  } finally {
    closeSync(fd);
  }
}

function unhex(escaped: string): string {
  return Buffer.from(escaped.replace(/\\x/g, ""), "hex").toString("utf8");
}

/**
 * The paths one strace line (`-xx -y` format) writes: open/openat with a write flag, and every
 * path-creating, -removing or -changing call. Relative paths resolve against the dirfd's path, or
 * the working directory.
 */
export function writtenPaths(line: string, cwd: string): { syscall: string; path: string }[] {
  const match = /^(\w+)\((.*)\) = (.*)$/.exec(line.trim());
  if (!match) return [];
  const [, syscall = "", args = "", result = ""] = match;
  if (syscall === "open" || syscall === "openat" || syscall === "openat2" || syscall === "creat") {
    if (syscall !== "creat" && !/O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND/.test(args)) return [];
    const returned = /^\d+<((?:\\x[0-9a-f]{2})*)>/.exec(result);
    if (returned) return [{ syscall, path: unhex(returned[1]!) }];
  }
  if (syscall === "bind" && !args.includes("AF_UNIX")) return [];
  const tokens: { dir?: string; str?: string }[] = [];
  const pattern = /(?:AT_FDCWD|-?\d+)<((?:\\x[0-9a-f]{2})*)>|"((?:\\x[0-9a-f]{2})*)"/g;
  for (let m = pattern.exec(args); m !== null; m = pattern.exec(args)) {
    if (m[1] !== undefined) tokens.push({ dir: unhex(m[1]) });
    else tokens.push({ str: unhex(m[2] ?? "") });
  }
  const out: { syscall: string; path: string }[] = [];
  let dir = cwd;
  const strings: string[] = [];
  for (const token of tokens) {
    if (token.dir !== undefined) dir = token.dir;
    else strings.push(path.resolve(dir, token.str!));
  }
  // The target of a symlink is not written; the first path of link() is only read.
  const written = syscall === "symlink" || syscall === "symlinkat" || syscall === "link" || syscall === "linkat" ? strings.slice(-1) : strings;
  for (const p of written) out.push({ syscall, path: p });
  return out;
}

/** One entry of a tree snapshot. */
type TreeEntry = string;

/** Every path under `root` (but `exclude`d subtrees) with its type, size and mtime. */
export function snapshotTree(root: string, exclude: readonly string[]): Map<string, TreeEntry> {
  const out = new Map<string, TreeEntry>();
  const walk = (dir: string) => {
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch {
      return;
    }
    for (const name of names) {
      const full = path.join(dir, name);
      if (exclude.includes(full)) continue;
      let stat;
      try {
        stat = lstatSync(full);
      } catch {
        continue;
      }
      out.set(
        full,
        `${stat.isDirectory() ? "d" : stat.isFile() ? "f" : "o"}:${stat.isDirectory() ? 0 : stat.size}:${stat.mtimeMs}:${(stat.mode & 0o7777).toString(8)}`,
      );
      if (stat.isDirectory()) walk(full);
    }
  };
  walk(root);
  return out;
}

/** Paths added, removed or changed between two snapshots. */
export function diffTrees(before: Map<string, TreeEntry>, after: Map<string, TreeEntry>): string[] {
  const changes: string[] = [];
  for (const [p, entry] of after) {
    const old = before.get(p);
    if (old === undefined) changes.push(`added ${p}`);
    else if (old !== entry) changes.push(`changed ${p}`);
  }
  for (const p of before.keys()) if (!after.has(p)) changes.push(`removed ${p}`);
  return changes;
}

/** The names in a directory (the `/tmp` listing). */
export function listing(dir: string): Set<string> {
  try {
    return new Set(readdirSync(dir));
  } catch {
    return new Set();
  }
}

/** A journal's size and the hash of its bytes. */
export interface JournalDigest {
  readonly size: number;
  readonly sha: string;
}

/** Digests of every `<state>/sessions/*.jsonl`, by session id. */
export function journalDigests(stateDir: string): Map<string, JournalDigest> {
  const dir = path.join(stateDir, "sessions");
  const out = new Map<string, JournalDigest>();
  for (const name of listing(dir)) {
    if (!name.endsWith(".jsonl")) continue;
    const bytes = readFileSync(path.join(dir, name));
    out.set(name.slice(0, -".jsonl".length), { size: bytes.length, sha: sha(bytes) });
  }
  return out;
}

function sha(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** How one journal changed: its old bytes must be untouched; the new lines' seqs are listed. */
export function journalChange(
  stateDir: string,
  sessionId: string,
  before: JournalDigest | undefined,
): { rewritten: boolean; newSeqs: number[]; badLines: number } {
  const bytes = readFileSync(path.join(stateDir, "sessions", `${sessionId}.jsonl`));
  const oldSize = before?.size ?? 0;
  const rewritten = bytes.length < oldSize || (before !== undefined && sha(bytes.subarray(0, oldSize)) !== before.sha);
  const newSeqs: number[] = [];
  let badLines = 0;
  for (const line of bytes
    .subarray(rewritten ? 0 : oldSize)
    .toString("utf8")
    .split("\n")) {
    if (line.trim() === "") continue;
    try {
      const entry = JSON.parse(line) as { seq?: unknown };
      if (typeof entry.seq === "number") newSeqs.push(entry.seq);
      else badLines++;
    } catch {
      badLines++;
    }
  }
  return { rewritten, newSeqs, badLines };
}

/** The ids in the budget's running tally file (`<state>/budget/running.json`). */
export function runningIds(stateDir: string): Set<string> {
  try {
    const parsed = JSON.parse(readFileSync(path.join(stateDir, "budget", "running.json"), "utf8")) as { entries?: { id?: unknown }[] };
    return new Set((parsed.entries ?? []).map((e) => String(e.id)));
  } catch {
    return new Set();
  }
}

/** Every file under `dir` whose name ends in `.lock`. */
export function lockFilesUnder(dir: string): string[] {
  const out: string[] = [];
  for (const p of snapshotTree(dir, []).keys()) if (p.endsWith(".lock")) out.push(p);
  return out;
}
