/**
 * The seed's own session store, runnable from tests: berth promises that journals move both ways
 * between it and the seed's `session-store.mjs` with the same snapshot, so the comparisons with
 * the seed run the real thing rather than a re-implementation of it. Tests of berth's own
 * behaviour beside another writer use `seed-writer.ts` instead and need no seed.
 *
 * The seeds are not part of the repository: `BERTH_SEEDS_DIR` names their directory (CI sets it);
 * without them the comparisons are skipped (one notice per
 * run, from test/harness/seeds-notice.ts), unless `BERTH_REQUIRE_SEEDS=1` (CI) makes that a
 * failure. The seed file holding the store is the one whose diff adds `session-store.mjs`; this
 * takes that section out of it, strips the leading `+`, and writes it into a temp dir as
 * `scripts/live/session-store.mjs`, with the two small modules it imports and the seed does not
 * include (their public versions): `scripts/lib/impeccable-paths.mjs` and
 * `scripts/live/vocabulary.mjs`.
 */
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { pathToFileURL } from "node:url";
import { isRequired } from "@berth/shared/testing/required-by-environment";
import { COMPLETED_SESSION_PHASES, GENERATION_FENCED_SESSION_PHASES } from "../vocabulary.js";

const STORE_SECTION = "scripts/live/session-store.mjs";

/** Where the seeds are: `BERTH_SEEDS_DIR` (a clone has no seeds of its own; CI points at its copy). */
export function seedsDir(): string | undefined {
  const dir = process.env.BERTH_SEEDS_DIR;
  return dir === undefined || dir === "" ? undefined : path.resolve(dir);
}

/** True when `BERTH_REQUIRE_SEEDS` asks for the comparisons with the seed to run (CI sets it). */
export function seedsRequired(): boolean {
  return isRequired("seeds");
}

let found: { file: string | undefined } | undefined;

/** The seed file holding the session store, or undefined when the seeds are not there. */
export function seedFilePath(): string | undefined {
  if (found) return found.file;
  let file: string | undefined;
  try {
    const dir = seedsDir();
    if (dir === undefined) throw new Error("BERTH_SEEDS_DIR is not set");
    for (const name of readdirSync(dir).sort()) {
      const candidate = path.join(dir, name);
      if (!name.endsWith(".txt")) continue;
      if (
        readFileSync(candidate, "utf8")
          .split("\n", 20)
          .some((line) => line.trim().endsWith(STORE_SECTION))
      ) {
        file = candidate;
        break;
      }
    }
  } catch {
    file = undefined;
  }
  found = { file };
  return file;
}

/** The one line that says what is skipped without the seeds and how to run it. */
export function missingSeedsNotice(
  what = "the comparisons against the seed's own session store (differential reducer and store properties, journals moving both ways)",
): string {
  const where = seedsDir() === undefined ? "BERTH_SEEDS_DIR is not set" : `the seeds are not at ${seedsDir()}`;
  return `${where}: skipped ${what}; run them with BERTH_SEEDS_DIR=<the directory holding the seed files>`;
}

/**
 * True when the seed's store can be loaded. False when the seeds are absent — unless they are
 * required (`BERTH_REQUIRE_SEEDS=1`): then it throws, so that a run meant to include the
 * comparisons cannot pass without them.
 */
export function seedsAvailable(): boolean {
  if (seedFilePath() !== undefined) return true;
  if (seedsRequired()) {
    throw new Error(
      `BERTH_REQUIRE_SEEDS is set but the seeds are not at ${seedsDir() ?? "(BERTH_SEEDS_DIR is not set)"}, so the comparisons against the seed's own session store cannot run; ` +
        "point BERTH_SEEDS_DIR at the directory holding the seed files",
    );
  }
  return false;
}

/** The seed file's text, or an error that says where it was looked for and how to point at it. */
function readSeedFile(): string {
  const file = seedFilePath();
  if (file === undefined) throw new Error(missingSeedsNotice());
  return readFileSync(file, "utf8");
}

/** The text of the seed's `session-store.mjs`, taken out of the seed's diff. */
export function extractSeedSessionStoreSource(seedText = readSeedFile()): string {
  const lines = seedText.split("\n");
  const header = lines.findIndex((line) => line.trim().endsWith(STORE_SECTION));
  if (header < 0) throw new Error("the seed file has no session-store.mjs section");
  const hunk = lines.findIndex((line, i) => i > header && line.startsWith("@@"));
  if (hunk < 0) throw new Error("the session-store.mjs section of the seed has no hunk");
  const body: string[] = [];
  for (let i = hunk + 1; i < lines.length && lines[i]!.startsWith("+"); i++) body.push(lines[i]!.slice(1));
  return `${body.join("\n")}\n`;
}

const PATHS_STUB = `import path from 'node:path';
export function getLiveDir(cwd = process.cwd()) { return path.join(cwd, '.impeccable', 'live'); }
export function getLiveSessionsDir(cwd = process.cwd()) { return path.join(getLiveDir(cwd), 'sessions'); }
export function getLegacyLiveSessionsDir(cwd = process.cwd()) { return path.join(cwd, '.impeccable-live', 'sessions'); }
export function safeSessionId(id) {
  if (typeof id === 'string' && /^[A-Za-z0-9_-]{1,128}$/.test(id)) return id;
  throw new Error('invalid session id: ' + JSON.stringify(id));
}
export function isLiveServerPidReachable(pid) {
  try { process.kill(pid, 0); return true; } catch (error) { return error && error.code === 'EPERM'; }
}
`;

/** The seed's snapshot store, as its callers see it. */
export interface SeedSessionStore {
  rootDir: string;
  legacyRootDir: string;
  appendEvent(event: Record<string, unknown>): Record<string, unknown>;
  has(id: string): boolean;
  getSnapshot(id?: string, opts?: { includeCompleted?: boolean }): Record<string, unknown> | null;
  flush(id?: string): Record<string, unknown>;
  listActiveSessions(): Array<Record<string, unknown>>;
}

/** The seed's module. */
export interface SeedSessionStoreModule {
  createLiveSessionStore(options?: { cwd?: string; sessionId?: string }): SeedSessionStore;
}

/** A loaded copy of the seed's store and a project directory for it. */
export interface SeedStoreHarness {
  module: SeedSessionStoreModule;
  /** The module's file URL, for a child process to import. */
  moduleUrl: string;
  /** A fresh project directory (the seed's `cwd`). */
  project: string;
  /** `<project>/.impeccable/live` — what berth is pointed at with `--live-dir`. */
  liveDir: string;
  /** `<project>/.impeccable/live/sessions`: where the seed keeps journals. */
  sessionsDir: string;
  /** `<project>/.impeccable-live/sessions`: the seed's legacy root. */
  legacySessionsDir: string;
  /** A seed store over the project (as a seed process would create it). */
  store(sessionId?: string): SeedSessionStore;
  /** Removes the temp dirs. */
  remove(): void;
}

/** Writes the seed's store and its two stubs into a temp dir and imports it. */
export async function loadSeedStore(): Promise<SeedStoreHarness> {
  const root = mkdtempSync(path.join(tmpdir(), "berth-seed-"));
  mkdirSync(path.join(root, "scripts", "live"), { recursive: true });
  mkdirSync(path.join(root, "scripts", "lib"), { recursive: true });
  writeFileSync(path.join(root, "scripts", "live", "session-store.mjs"), extractSeedSessionStoreSource());
  writeFileSync(path.join(root, "scripts", "lib", "impeccable-paths.mjs"), PATHS_STUB);
  writeFileSync(
    path.join(root, "scripts", "live", "vocabulary.mjs"),
    `export const COMPLETED_SESSION_PHASES = ${JSON.stringify(COMPLETED_SESSION_PHASES)};\n` +
      `export const GENERATION_FENCED_SESSION_PHASES = ${JSON.stringify(GENERATION_FENCED_SESSION_PHASES)};\n`,
  );
  const url = pathToFileURL(path.join(root, "scripts", "live", "session-store.mjs")).href;
  const module = (await import(/* @vite-ignore */ url)) as SeedSessionStoreModule;
  const project = path.join(root, "project");
  mkdirSync(project, { recursive: true });
  const liveDir = path.join(project, ".impeccable", "live");
  return {
    module,
    moduleUrl: url,
    project,
    liveDir,
    sessionsDir: path.join(liveDir, "sessions"),
    legacySessionsDir: path.join(project, ".impeccable-live", "sessions"),
    store: (sessionId) => module.createLiveSessionStore(sessionId === undefined ? { cwd: project } : { cwd: project, sessionId }),
    remove: () => rmSync(root, { recursive: true, force: true }),
  };
}
