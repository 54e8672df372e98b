/**
 * For the session store's tests: a temporary directory and a manual clock of its own for each test,
 * stores opened in it and closed after it, and what the tests read their results with.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, expect } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { isBerthError, type BerthError } from "@berth/shared/errors";
import { encodeSeedLine } from "./journal/journal-format.js";
import { type SessionStoreOptions, createSessionStore } from "./create-session-store.js";
import type { SessionStore } from "./session-store.js";
import type { StoredEntry } from "./journal/journal-store.js";

// Reassigned before each test; importers read the binding live, as they would a local variable.
export let dir: string;
export let clock: ManualClock;
const stores: SessionStore[] = [];

/** Gives each test of the calling file a fresh directory and clock, and closes the stores it opened. */
export function temporaryStores(): void {
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-store-"));
    clock = new ManualClock(Date.UTC(2026, 0, 1));
  });

  afterEach(async () => {
    for (const store of stores.splice(0)) await store.close().catch(() => undefined);
    fs.rmSync(dir, { recursive: true, force: true });
  });
}

export function open(options: Partial<SessionStoreOptions> = {}): SessionStore {
  const store = createSessionStore({ dir: path.join(dir, "sessions"), clock, fsync: "batch", ...options });
  stores.push(store);
  return store;
}

export function journal(id: string, root = path.join(dir, "sessions")): string {
  return path.join(root, `${id}.jsonl`);
}

async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}

/** The entries a read returns ([] for a session with no journal). */
export async function readAll(store: SessionStore, sessionId: string, fromSeq?: number, limit?: number): Promise<StoredEntry[]> {
  const reading = store.read(sessionId, fromSeq, limit);
  return reading === null ? [] : collect(reading.entries);
}

export async function expectBerthError(promise: Promise<unknown> | (() => unknown), code: string, reason?: string): Promise<BerthError> {
  try {
    if (typeof promise === "function") await promise();
    else await promise;
  } catch (error) {
    expect(isBerthError(error), String(error)).toBe(true);
    expect((error as BerthError).code).toBe(code);
    if (reason !== undefined) expect((error as BerthError).reason).toBe(reason);
    return error as BerthError;
  }
  throw new Error(`expected a BerthError ${code}`);
}

/** A seed-format line (no checksum) with a seq of the test's choosing, as the seed's store writes one. */
export function seedLine(seq: number, id: string, event: Record<string, unknown>, ts = "2026-01-01T00:00:00.000Z"): string {
  return encodeSeedLine({ seq, id, type: String(event.type), ts, event: { ...event, id } });
}
