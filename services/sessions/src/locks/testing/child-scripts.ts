/**
 * Builds a TypeScript entry point of these tests into one runnable .mjs file, so that a child node
 * process (Node 20 cannot run TypeScript) executes berth's own lock-file code, not a copy of it.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "rolldown";

const here = path.dirname(fileURLToPath(import.meta.url));
const sharedSources = path.resolve(here, "../../../../../packages/shared/src");
const require = createRequire(import.meta.url);

/** A directory of built child scripts; `dispose()` removes it. */
export interface ChildScripts {
  /** The path of the built script for `entry` (a file name in this directory, e.g. "seed-holder-child.ts"). */
  script(entry: string): Promise<string>;
  dispose(): void;
}

/** Bundles child entry points on demand (each once) into a temporary directory. */
export function childScripts(): ChildScripts {
  const outDir = mkdtempSync(path.join(tmpdir(), "berth-lock-children-"));
  const built = new Map<string, Promise<string>>();
  // A native addon cannot be bundled: keep it external, by absolute path, so the script runs from
  // a directory with no node_modules.
  const fsExt = require.resolve("fs-ext");
  return {
    script(entry) {
      let result = built.get(entry);
      if (!result) {
        const file = path.join(outDir, entry.replace(/\.ts$/, ".mjs"));
        result = build({
          input: path.join(here, entry),
          platform: "node",
          logLevel: "warn",
          plugins: [{ name: "native-fs-ext", resolveId: (source) => (source === "fs-ext" ? { id: fsExt, external: true } : null) }],
          resolve: { alias: { "@berth/shared": sharedSources }, extensionAlias: { ".js": [".ts", ".js"] } },
          output: { file, format: "esm" },
        }).then(() => file);
        built.set(entry, result);
      }
      return result;
    },
    dispose() {
      rmSync(outDir, { recursive: true, force: true });
    },
  };
}

/** A child process speaking JSON lines on stdout and reading lines on stdin. */
export interface Child {
  readonly process: ChildProcess;
  readonly pid: number;
  /** Resolves with the first event (past or future, not yet taken) matching `event`; rejects after `timeoutMs`. */
  next(event: string, timeoutMs?: number): Promise<Record<string, unknown>>;
  send(line: string): void;
  /** Resolves with the exit code (or signal) once the child has exited. */
  readonly exited: Promise<number | string>;
}

/** Starts `node script JSON.stringify(config)`. */
export function spawnChild(script: string, config: unknown): Child {
  const child = spawn(process.execPath, [script, JSON.stringify(config)], { stdio: ["pipe", "pipe", "inherit"] });
  const backlog: Array<Record<string, unknown>> = [];
  const listeners = new Set<() => void>();
  let buffered = "";
  child.stdout!.setEncoding("utf8");
  child.stdout!.on("data", (chunk: string) => {
    buffered += chunk;
    let newline: number;
    while ((newline = buffered.indexOf("\n")) >= 0) {
      backlog.push(JSON.parse(buffered.slice(0, newline)) as Record<string, unknown>);
      buffered = buffered.slice(newline + 1);
    }
    for (const listener of [...listeners]) listener();
  });
  const exited = new Promise<number | string>((resolve) => child.on("exit", (code, signal) => resolve(code ?? signal ?? -1)));
  return {
    process: child,
    pid: child.pid!,
    exited,
    send(line) {
      child.stdin!.write(`${line}\n`);
    },
    next(event, timeoutMs = 10_000) {
      return new Promise((resolve, reject) => {
        const look = () => {
          const index = backlog.findIndex((e) => e.event === event);
          if (index < 0) return false;
          const [found] = backlog.splice(index, 1);
          listeners.delete(look);
          clearTimeout(timer);
          resolve(found!);
          return true;
        };
        const timer = setTimeout(() => {
          listeners.delete(look);
          reject(new Error(`child ${child.pid}: no "${event}" within ${timeoutMs} ms (seen: ${JSON.stringify(backlog)})`));
        }, timeoutMs);
        if (!look()) listeners.add(look);
        void exited.then(() => setTimeout(() => look() || undefined, 0));
      });
    },
  };
}

/** The pid of a process that has exited (for "dead holder" lock files). */
export async function deadPid(): Promise<number> {
  const child = spawn(process.execPath, ["-e", "0"], { stdio: "ignore" });
  await new Promise((resolve) => child.on("exit", resolve));
  return child.pid!;
}
