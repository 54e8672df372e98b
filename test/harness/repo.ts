/**
 * Where things are in the repository, found from this file so that tests work from any working
 * directory and both from the TypeScript sources (vitest) and from `test/dist` (tsc output).
 */
import { existsSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

/** What `startService` can run. `up` is `berth up`: both services in one process. */
export type ServiceKind = "sessions" | "budget" | "up";

/** The servers (by the `server` field of their "listening" log line) each kind runs. */
export const SERVERS_OF: Readonly<Record<ServiceKind, readonly ("sessions" | "budget")[]>> = {
  sessions: ["sessions"],
  budget: ["budget"],
  up: ["sessions", "budget"],
};

function findRepoRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = path.join(dir, "package.json");
    if (existsSync(manifest)) {
      try {
        const parsed = JSON.parse(readFileSync(manifest, "utf8")) as { workspaces?: unknown };
        if (Array.isArray(parsed.workspaces)) return dir;
      } catch {
        // not the root manifest; keep walking up
      }
    }
    const parent = path.dirname(dir);
    if (parent === dir) throw new Error(`cannot find the berth repository root above ${fileURLToPath(import.meta.url)}`);
    dir = parent;
  }
}

/** The repository root (the directory of the workspace manifest). */
export const REPO_ROOT = findRepoRoot();

/** An absolute path inside the repository. */
export function repoPath(...parts: string[]): string {
  return path.join(REPO_ROOT, ...parts);
}

/** The built entry point and its leading arguments for each kind. */
const ENTRY_POINTS: Readonly<Record<ServiceKind, { script: string; args: readonly string[] }>> = {
  sessions: { script: "services/sessions/dist/main.js", args: [] },
  budget: { script: "services/budget/dist/main.js", args: [] },
  up: { script: "packages/cli/bin/berth.js", args: ["up"] },
};

/**
 * The script and leading arguments that run `kind`. Throws when the build output is missing: the
 * tests run what `npm test` built (its `pretest` runs `tsc -b`); they never build by themselves.
 */
export function entryPoint(kind: ServiceKind): { script: string; args: readonly string[] } {
  const entry = ENTRY_POINTS[kind];
  const script = repoPath(entry.script);
  if (!existsSync(script)) {
    throw new Error(`${entry.script} is missing: run npm run build (or npm test, which builds first) before the end-to-end tests`);
  }
  return { script, args: entry.args };
}

/** The `buf` command installed by @bufbuild/buf (what `npx buf` runs). */
export function bufBinary(): string {
  const bin = repoPath("node_modules", ".bin", "buf");
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run npm install (@bufbuild/buf is a dev dependency)`);
  return bin;
}
