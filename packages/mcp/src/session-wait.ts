/**
 * `session_wait`: block until a session reaches a seq, a phase, or gets an event of a type, or the
 * wait runs out. On one WatchSession stream from where the session stands (no polling): the entries
 * since `afterSeq`, `caughtUp` with the current snapshot, then each new entry with its snapshot.
 */
import { Code } from "@connectrpc/connect";
import { BerthClientError, SESSIONS_REASONS, type SessionsClient } from "@berth/client";
import type { JournalEntry } from "@berth/api/berth/sessions/v1/session_service_pb";
import type { Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";

/** What to wait for: the first of them met ends the wait. */
export interface WaitCondition {
  /** The session's last seq is at least this. */
  readonly untilSeq?: number | undefined;
  /** The session's phase is this. */
  readonly phase?: string | undefined;
  /** An entry of this type is appended after `afterSeq`. */
  readonly eventType?: string | undefined;
  /** Entries after this seq count for `eventType`; default: the session's last seq when the wait starts (only new ones). */
  readonly afterSeq?: number | undefined;
}

/** How a wait ended. */
export interface WaitOutcome {
  readonly reached: boolean;
  /** Which condition was met; undefined when the wait ran out. */
  readonly matched?: "untilSeq" | "phase" | "eventType";
  /** The session's last seq seen. */
  readonly lastSeq: bigint;
  /** Its phase then ("" before its first entry). */
  readonly phase: string;
  /** The entry that met `eventType`. */
  readonly entry?: JournalEntry;
  /** The snapshot when the wait ended, when the watch sent one. */
  readonly snapshot?: Snapshot;
}

/** How often a wait reports that it still waits (a host's call timeout is often a minute). */
export const WAIT_PROGRESS_INTERVAL_MS = 10_000;

/** Waits on `sessionId` until `condition` is met or `timeoutMs` passes; `signal` cancels (throws). */
export async function waitForSession(
  sessions: SessionsClient,
  sessionId: string,
  condition: WaitCondition,
  options: { readonly timeoutMs: number; readonly signal?: AbortSignal; readonly onProgress?: (lastSeq: bigint, phase: string) => void },
): Promise<WaitOutcome> {
  let lastSeq = 0n;
  let phase = "";
  try {
    const current = await sessions.snapshot(sessionId, { signal: options.signal });
    lastSeq = current.lastSeq;
    phase = current.snapshot?.phase ?? "";
  } catch (error) {
    // A session with no entry yet is watched from its first append.
    if (!(error instanceof BerthClientError && error.reason === SESSIONS_REASONS.SESSION_NOT_FOUND)) throw error;
  }
  const after = condition.afterSeq === undefined ? lastSeq : BigInt(condition.afterSeq);
  const untilSeq = condition.untilSeq === undefined ? undefined : BigInt(condition.untilSeq);
  const met = (snapshot: Snapshot | undefined): "untilSeq" | "phase" | undefined =>
    untilSeq !== undefined && lastSeq >= untilSeq ? "untilSeq" : condition.phase !== undefined && snapshot?.phase === condition.phase ? "phase" : undefined;

  const stop = new AbortController();
  const timedOut = new Error("the wait ran out");
  const timer = setTimeout(() => stop.abort(timedOut), options.timeoutMs);
  const onCancel = () => stop.abort(options.signal?.reason);
  options.signal?.addEventListener("abort", onCancel, { once: true });
  try {
    const fromSeq = (after < lastSeq ? after : lastSeq) + 1n;
    for await (const event of sessions.watch(sessionId, {
      fromSeq,
      includeSnapshot: true,
      progressIntervalMs: WAIT_PROGRESS_INTERVAL_MS,
      signal: stop.signal,
    })) {
      if (event.kind === "entry") {
        lastSeq = event.entry.seq;
        if (event.snapshot !== undefined) phase = event.snapshot.phase;
        if (condition.eventType !== undefined && event.entry.type === condition.eventType && event.entry.seq > after) {
          return { reached: true, matched: "eventType", lastSeq, phase, entry: event.entry, ...(event.snapshot ? { snapshot: event.snapshot } : {}) };
        }
        // Before caughtUp an entry has no snapshot: the seq and the phase are judged at caughtUp.
        const which = event.live ? met(event.snapshot) : undefined;
        if (which !== undefined) return { reached: true, matched: which, lastSeq, phase, ...(event.snapshot ? { snapshot: event.snapshot } : {}) };
      } else if (event.kind === "caughtUp") {
        if (event.lastSeq > lastSeq) lastSeq = event.lastSeq;
        if (event.snapshot !== undefined) phase = event.snapshot.phase;
        const which = met(event.snapshot);
        if (which !== undefined) return { reached: true, matched: which, lastSeq, phase, ...(event.snapshot ? { snapshot: event.snapshot } : {}) };
      } else if (event.kind === "progress") {
        options.onProgress?.(lastSeq, phase);
      }
    }
    throw BerthClientError.from(new Error("the service ended the watch"), Code.Unavailable);
  } catch (error) {
    if (stop.signal.reason === timedOut) return { reached: false, lastSeq, phase };
    throw error;
  } finally {
    clearTimeout(timer);
    options.signal?.removeEventListener("abort", onCancel);
    stop.abort();
  }
}
