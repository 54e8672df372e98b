/**
 * Fencing tokens that only ever rise, across restarts and crashes of the service.
 *
 * One counter serves every lock. A token has to be strictly greater than every earlier token *of the
 * same file*; a single counter gives that for free (it rises for all files at once), keeps the state
 * at one number however many files were ever locked, and is what etcd does (its lock's fencing
 * token is the revision of its whole keyspace). Holders compare tokens of one file only, so gaps are harmless.
 *
 * Persisting each token would put an fsync on every Acquire. Instead the fencing file reserves tokens in
 * blocks: before handing out any token of a block it durably records the block's end as the
 * *ceiling* ("no token at or above this was ever issued"), then hands the block out from memory.
 * After a crash the service restarts from the ceiling, skipping what remained of the block — tokens
 * still rise, at the cost of a gap. A clean `close()` records the exact next token instead, so an
 * orderly restart leaves no gap. One fsync per `blockSize` grants.
 *
 * File: `<stateDir>/locks/fencing.json` = `{"version":1,"ceiling":N}`, written atomically (temp file,
 * fsync, rename). The record is padded with spaces to a fixed length, so that on a full disk, where
 * a temp file cannot be written, it is overwritten in place instead — in the block the file already
 * has, one write and one fdatasync — and locks go on being granted. (A power cut in the middle of
 * that one-block write could leave a record that does not parse: the service then refuses to start
 * and says what to do, rather than guess a ceiling.)
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { BerthError } from "@berth/shared/errors";
import { confirmStillWritable, ensurePrivateDir, writeFileAtomicSync } from "@berth/shared/files";
import { retryAfterRelief } from "@berth/shared/descriptors";
import { isDiskFull, stateWriteError } from "@berth/shared/state-errors";
import { LOCK_RETRY_AFTER_MS } from "./lock-input.js";
import type { LockPersistence } from "./lock-persistence.js";

/** Options of {@link createFencingFile}. */
export interface FencingFileOptions {
  /** How many tokens one durable write reserves. Default 1000. */
  blockSize?: number;
}

/** Where the fencing state of `stateDir` lives. */
export function fencingFilePath(stateDir: string): string {
  return path.join(stateDir, "locks", "fencing.json");
}

/** The lock table's persistence backed by a file; see the module comment for the scheme. */
export interface FencingFile extends LockPersistence {
  /** The file the ceiling is kept in. */
  readonly file: string;
}

const FORMAT_VERSION = 1;

/** The length of the record, newline included: room for any safe integer, padded with spaces. */
const RECORD_BYTES = 64;

/** The record for `ceiling`, padded to {@link RECORD_BYTES} (JSON allows the trailing spaces). */
export function fencingRecord(ceiling: number): string {
  const json = JSON.stringify({ version: FORMAT_VERSION, ceiling });
  return `${json.padEnd(RECORD_BYTES - 1, " ")}\n`;
}

/** Overwrites the start of the existing `file` with `record` and fdatasyncs it: no new block needed. */
function overwriteInPlace(file: string, record: string): void {
  const fd = fs.openSync(file, "r+");
  try {
    const bytes = Buffer.from(record, "utf8");
    let offset = 0;
    while (offset < bytes.length) offset += fs.writeSync(fd, bytes, offset, bytes.length - offset, offset);
    fs.fdatasyncSync(fd);
    confirmStillWritable(fd);
  } finally {
    fs.closeSync(fd);
  }
}

function readCeiling(file: string): number {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return 1;
    throw error;
  }
  let ceiling: unknown;
  try {
    ceiling = (JSON.parse(text) as { ceiling?: unknown }).ceiling;
  } catch {
    ceiling = undefined;
  }
  if (typeof ceiling !== "number" || !Number.isSafeInteger(ceiling) || ceiling < 1) {
    // Guessing a floor could hand out a token some client still holds as current, which is
    // exactly what fencing exists to prevent: refuse to start and say what to do.
    throw new BerthError(
      "internal",
      `fencing state ${file} is damaged (${JSON.stringify(text.slice(0, 80))}); restore it, or replace it with {"version":1,"ceiling":N} where N is above every fencing token any client may still hold`,
      { file },
    );
  }
  return ceiling;
}

/** Opens (or creates) the fencing state of `stateDir`. Throws when the file exists but is damaged. */
export function createFencingFile(stateDir: string, options: FencingFileOptions = {}): FencingFile {
  const blockSize = options.blockSize ?? 1000;
  if (!Number.isSafeInteger(blockSize) || blockSize < 1) throw new RangeError(`blockSize must be a positive integer, got ${blockSize}`);
  const file = fencingFilePath(stateDir);
  ensurePrivateDir(path.dirname(file));
  // `nextToken` is never below the durable ceiling of an earlier run; `reservedUntil` is the
  // ceiling this run has made durable (nothing reserved yet: it equals the starting point).
  let nextToken = readCeiling(file);
  let reservedUntil = nextToken;

  const persist = (ceiling: number) => {
    const record = fencingRecord(ceiling);
    try {
      writeFileAtomicSync(file, record);
    } catch (error) {
      // No room for a temp file: the record's fixed length lets it take the old one's place.
      if (!isDiskFull(error) || !fs.existsSync(file)) throw error;
      overwriteInPlace(file, record);
    }
  };

  return {
    file,
    next() {
      if (nextToken >= reservedUntil) {
        const ceiling = nextToken + blockSize;
        try {
          // Short of descriptors, the idle journals are closed and the ceiling written once more (the same record: idempotent).
          retryAfterRelief(() => persist(ceiling));
        } catch (error) {
          throw (
            stateWriteError(error, `no lock was granted: cannot reserve fencing tokens in ${file}`, stateDir, { file }) ??
            new BerthError(
              "unavailable",
              `cannot reserve fencing tokens in ${file}: ${(error as Error).message}`,
              { file },
              { reason: "STORAGE_UNAVAILABLE", retryAfterMs: LOCK_RETRY_AFTER_MS },
            )
          );
        }
        reservedUntil = ceiling;
      }
      return nextToken++;
    },
    peek: () => nextToken,
    close() {
      if (reservedUntil === nextToken) return;
      persist(nextToken);
      reservedUntil = nextToken;
    },
  };
}
