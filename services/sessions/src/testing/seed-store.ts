/**
 * The seed's own session store, runnable from tests: berth promises that journals move both ways
 * between it and the seed's `session-store.mjs` with the same snapshot, so differential tests run
 * the real thing rather than a re-implementation of it.
 *
 * The seed file is a diff; this takes the `session-store.mjs` section out of it, strips the
 * leading `+`, and writes it into a temp dir as `scripts/live/session-store.mjs`, with the two
 * small modules it imports and the seed does not include (their public versions, as DESIGN.md
 * describes them): `scripts/lib/impeccable-paths.mjs` and `scripts/live/vocabulary.mjs`.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { COMPLETED_SESSION_PHASES, GENERATION_FENCED_SESSION_PHASES } from "../vocabulary.js";

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

/** The seed file holding the session store; `BERTH_SEEDS_DIR` overrides where the seeds are. */
export function seedFilePath(): string {
  const seeds = process.env.BERTH_SEEDS_DIR ?? path.resolve(repoRoot, "../shared/seeds");
  return path.join(seeds, "000_ab834bdb9637be2c.txt");
}

/** The seed file's text, or an error that says where it was looked for and how to point at it. */
function readSeedFile(): string {
  const file = seedFilePath();
  try {
    return readFileSync(file, "utf8");
  } catch (error) {
    throw new Error(
      `the seeds are not at ${file} (${(error as NodeJS.ErrnoException).code}): these tests run the seed's own store; ` +
        "keep the shared/ folder beside the repository (as CI does) or set BERTH_SEEDS_DIR",
    );
  }
}

/** The text of the seed's `session-store.mjs`, taken out of the seed's diff. */
export function extractSeedSessionStoreSource(seedText = readSeedFile()): string {
  const lines = seedText.split("\n");
  const header = lines.findIndex((line) => line.trim().endsWith("scripts/live/session-store.mjs"));
  if (header < 0) throw new Error("the seed file has no session-store.mjs section");
  const hunk = lines.findIndex((line, i) => i > header && line.startsWith("@@"));
  if (hunk < 0) throw new Error("the session-store.mjs section of the seed has no hunk");
  const body: string[] = [];
  for (let i = hunk + 1; i < lines.length && lines[i]!.startsWith("+"); i++) body.push(lines[i]!.slice(1));
  return body.join("\n") + "\n";
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
    project,
    liveDir,
    sessionsDir: path.join(liveDir, "sessions"),
    legacySessionsDir: path.join(project, ".impeccable-live", "sessions"),
    store: (sessionId) => module.createLiveSessionStore(sessionId === undefined ? { cwd: project } : { cwd: project, sessionId }),
    remove: () => rmSync(root, { recursive: true, force: true }),
  };
}
