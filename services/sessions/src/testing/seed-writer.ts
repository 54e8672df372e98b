/**
 * A test stand-in for a process that appends with the seed's session store (`appendEvent`),
 * following it step by step, so that tests of berth beside another writer need none of the seed's
 * code:
 * 1. if the primary root has no journal and the legacy root has one, copy it over;
 * 2. the next seq: the snapshot file's `__nextSeq` when its `__journalBytes` is the journal's
 *    size (and its `id` the session's), else max(seq) + 1 over the journal's lines that parse to
 *    an object with an integer seq (1 for none) — read, then written, with no lock;
 * 3. append `{"seq","id","type","ts","event"}` and a newline with one O_APPEND write, where
 *    `event` is the caller's event with `id` set;
 * 4. (`snapshotFile`) write the snapshot file as the seed does after every append: the state it
 *    derived plus the journal's size *after* the append and the next seq, pretty-printed. Its
 *    state keeps every diagnostic and carries a `diagnosticsTotal` it read from a file (berth's)
 *    unchanged, as the seed, knowing nothing of it, does.
 *
 * The seed's in-memory cache of the derived state is left out: it only spares a process re-reading
 * what it wrote itself.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { checkSessionId } from "@berth/shared/safe-id";
import { encodeSeedLine } from "../journal/journal-format.js";
import { applyEvent, baseSnapshot, type Diagnostic, type SessionSnapshot } from "../reducer.js";
import { journalPath, snapshotPath } from "../journal/session-paths.js";
import { META_JOURNAL_BYTES, META_NEXT_SEQ } from "../journal/snapshot-file.js";

/** Where a seed process keeps journals. */
export interface SeedDirs {
  /** `<live>/sessions`. */
  dir: string;
  /** The legacy root `<project>/.impeccable-live/sessions`, if any. */
  legacyDir?: string;
}

/** Options of {@link seedAppend}. */
export interface SeedAppendOptions {
  /** Write the snapshot file after the append, as the seed's store does (default false: the journal line only). */
  snapshotFile?: boolean;
  /** The entry's `ts` (default: now, as the seed takes it). */
  ts?: string;
}

/** What a seed process derived and wrote. */
export interface SeedAppended {
  seq: number;
  /** The line, newline included. */
  line: string;
  /** The state after the append, as the seed derives it. */
  snapshot: SessionSnapshot;
}

/** The seed's state of a session: from a current snapshot file, else from a replay of the journal. */
export function seedReadState(dirs: SeedDirs, id: string): { snapshot: SessionSnapshot; nextSeq: number } {
  const journal = readableJournal(dirs, id);
  const size = sizeOrNull(journal);
  if (size !== null) {
    const hydrated = readCurrentSnapshotFile(snapshotPath(dirs.dir, checkSessionId(id)), id, size);
    if (hydrated) return hydrated;
  }
  return seedReplay(journal, id);
}

/** Appends `event` to session `id` as a seed process does (see the module comment). */
export function seedAppend(dirs: SeedDirs, id: string, event: Record<string, unknown>, options: SeedAppendOptions = {}): SeedAppended {
  const normalized: Record<string, unknown> = { ...event, id };
  const type = normalized.type;
  if (typeof type !== "string" || type === "") throw new Error("event type required");
  fs.mkdirSync(dirs.dir, { recursive: true });
  const primary = journalPath(dirs.dir, checkSessionId(id));
  if (dirs.legacyDir !== undefined && !fs.existsSync(primary)) {
    const legacy = journalPath(dirs.legacyDir, checkSessionId(id));
    if (fs.existsSync(legacy)) fs.copyFileSync(legacy, primary);
  }
  const prior = seedReadState(dirs, id);
  const entry = { seq: prior.nextSeq, id, type, ts: options.ts ?? new Date().toISOString(), event: normalized };
  const line = encodeSeedLine(entry);
  fs.appendFileSync(primary, line);
  const snapshot = seedApply(prior.snapshot, entry);
  if (options.snapshotFile) seedWriteSnapshotFile(dirs, id, snapshot, prior.nextSeq + 1);
  return { seq: entry.seq, line, snapshot };
}

/**
 * Writes the seed's snapshot file for `snapshot`: `__journalBytes` is the journal's size now,
 * whatever landed in it since the state was derived (the seed stats it after its append).
 */
export function seedWriteSnapshotFile(dirs: SeedDirs, id: string, snapshot: SessionSnapshot, nextSeq: number): void {
  const size = sizeOrNull(readableJournal(dirs, id)) ?? -1;
  const payload = { ...snapshot, [META_JOURNAL_BYTES]: size, [META_NEXT_SEQ]: nextSeq };
  fs.writeFileSync(snapshotPath(dirs.dir, checkSessionId(id)), `${JSON.stringify(payload, null, 2)}\n`);
}

/**
 * The seed's `applyEvent`: berth's reducer, less berth's bound on diagnostics — the seed keeps
 * every one, and leaves a `diagnosticsTotal` it does not know as it found it.
 */
export function seedApply(snapshot: SessionSnapshot, entry: Record<string, unknown>): SessionSnapshot {
  const { diagnosticsTotal, ...rest } = snapshot;
  const applied = applyEvent({ ...rest, diagnostics: [] } as SessionSnapshot, entry);
  const { diagnosticsTotal: _none, ...next } = applied;
  const result: SessionSnapshot = { ...next, diagnostics: [...snapshot.diagnostics, ...applied.diagnostics] };
  if (diagnosticsTotal !== undefined) result.diagnosticsTotal = diagnosticsTotal;
  return result;
}

/** The seed's rebuild: every line that parses applied in order, the parse failures after them all. */
function seedReplay(journal: string, id: string): { snapshot: SessionSnapshot; nextSeq: number } {
  let snapshot = baseSnapshot(id);
  let nextSeq = 1;
  let text: string;
  try {
    text = fs.readFileSync(journal, "utf8");
  } catch {
    return { snapshot, nextSeq };
  }
  const failures: Diagnostic[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    if (!line.trim()) continue;
    try {
      const entry = JSON.parse(line) as unknown;
      if (!entry || typeof entry !== "object") throw new Error("entry is not object");
      const seq = (entry as { seq?: unknown }).seq;
      if (Number.isInteger(seq)) nextSeq = Math.max(nextSeq, (seq as number) + 1);
      snapshot = seedApply(snapshot, entry as Record<string, unknown>);
    } catch (error) {
      failures.push({ error: "journal_parse_failed", line: i + 1, message: (error as Error).message });
    }
  }
  return { snapshot: { ...snapshot, diagnostics: [...snapshot.diagnostics, ...failures] }, nextSeq };
}

function readCurrentSnapshotFile(file: string, id: string, journalBytes: number): { snapshot: SessionSnapshot; nextSeq: number } | null {
  let parsed: Record<string, unknown>;
  try {
    parsed = JSON.parse(fs.readFileSync(file, "utf8")) as Record<string, unknown>;
  } catch {
    return null;
  }
  if (!parsed || typeof parsed !== "object") return null;
  if (parsed[META_JOURNAL_BYTES] !== journalBytes) return null;
  const nextSeq = parsed[META_NEXT_SEQ];
  if (!Number.isInteger(nextSeq)) return null;
  delete parsed[META_JOURNAL_BYTES];
  delete parsed[META_NEXT_SEQ];
  if (parsed.id !== id) return null;
  return { snapshot: { ...baseSnapshot(id), ...parsed } as SessionSnapshot, nextSeq: nextSeq as number };
}

function readableJournal(dirs: SeedDirs, id: string): string {
  const primary = journalPath(dirs.dir, checkSessionId(id));
  if (fs.existsSync(primary) || dirs.legacyDir === undefined) return primary;
  const legacy = journalPath(dirs.legacyDir, checkSessionId(id));
  return fs.existsSync(legacy) ? legacy : primary;
}

function sizeOrNull(file: string): number | null {
  try {
    return fs.statSync(file).size;
  } catch {
    return null;
  }
}

/** The seed's directories inside a project: `<project>/.impeccable/live/sessions` and its legacy root. */
export function seedDirsOf(project: string): { liveDir: string; dir: string; legacyDir: string } {
  const liveDir = path.join(project, ".impeccable", "live");
  return { liveDir, dir: path.join(liveDir, "sessions"), legacyDir: path.join(project, ".impeccable-live", "sessions") };
}
