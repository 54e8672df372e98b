/**
 * Prepares TypeScript entry points of these tests for child node processes (Node 20 cannot run
 * TypeScript), so that a child executes berth's own lock-file code, not a copy of it: the entry and
 * every module it imports — relative ones and `@berth/shared/*` — are transpiled (types stripped,
 * nothing type-checked) into a temp dir laid out like the repository.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, "../../../../..");
const sharedSources = path.join(repoRoot, "packages/shared/src");

/** A directory of prepared child scripts; `dispose()` removes it. */
export interface ChildScripts {
  /** The path of the runnable script for `entry` (a file name in this directory, e.g. "seed-holder-child.ts", or an absolute path). */
  script(entry: string): Promise<string>;
  dispose(): void;
}

const IMPORT_SPECIFIER = /(\bfrom\s*|\bimport\s*\(?\s*)(["'])([^"']+)\2/g;

/** Transpiles entry points and what they import (each module once) into a temporary directory. */
export function childScripts(): ChildScripts {
  const outDir = mkdtempSync(path.join(tmpdir(), "berth-lock-children-"));
  // Bare imports (fs-ext) resolve by walking up from the importing file: give them the repo's.
  symlinkSync(path.join(repoRoot, "node_modules"), path.join(outDir, "node_modules"), "dir");
  const done = new Set<string>();

  const transpile = (source: string): string => {
    const target = path.join(outDir, path.relative(repoRoot, source)).replace(/\.ts$/, ".js");
    if (done.has(source)) return target;
    done.add(source);
    const output = ts.transpileModule(readFileSync(source, "utf8"), {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, verbatimModuleSyntax: true },
      fileName: source,
    }).outputText;
    const rewritten = output.replace(IMPORT_SPECIFIER, (whole, lead: string, quote: string, specifier: string) => {
      let imported: string | undefined;
      if (specifier.startsWith("@berth/shared/")) imported = path.join(sharedSources, `${specifier.slice("@berth/shared/".length)}.ts`);
      else if (specifier.startsWith(".")) imported = path.resolve(path.dirname(source), specifier).replace(/\.js$/, ".ts");
      if (!imported) return whole;
      let relative = path.relative(path.dirname(target), transpile(imported));
      if (!relative.startsWith(".")) relative = `./${relative}`;
      return `${lead}${quote}${relative}${quote}`;
    });
    mkdirSync(path.dirname(target), { recursive: true });
    writeFileSync(target, rewritten);
    return target;
  };

  return {
    script: async (entry) => transpile(path.isAbsolute(entry) ? entry : path.join(here, entry)),
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
