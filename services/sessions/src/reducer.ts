/**
 * The session reducer: how a journal of events becomes a session snapshot.
 *
 * Every rule reproduces the seed's `applyEvent` (session-store.mjs) exactly, including its
 * JavaScript corner cases (`??` against `||`, `Number(...)` on strings, `Date.parse(ts) || null`),
 * so that a journal gives the same snapshot whether the seed's store or berth reads it. Events are
 * not validated here, as in the seed: a junk event can put any JSON value in a snapshot field, and
 * the declared field types describe what well-formed events produce.
 *
 * Two deliberate differences:
 * - `diagnostics` keeps the newest {@link MAX_DIAGNOSTICS} entries and `diagnosticsTotal` counts
 *   every diagnostic ever recorded. The seed keeps them all, which made every ignored event cost
 *   O(diagnostics so far). `diagnosticsTotal` appears only once more than {@link MAX_DIAGNOSTICS}
 *   diagnostics have been recorded (read it as `diagnosticsTotal ?? diagnostics.length`), so a
 *   snapshot with at most that many is exactly the seed's snapshot, with no extra key.
 * - A value JavaScript cannot turn into a primitive (see seed-coercions.ts), where the seed's rules
 *   convert one, is read as NaN instead of throwing; on such an event the seed's store fails.
 *
 * The rules, event by event, are event-rules.ts (with the seed's conversions in seed-coercions.ts);
 * here are the snapshot, its copies, the replay and the bound on diagnostics.
 */
import { reduceInto, toPendingEvent, type Loose, type ReduceContext } from "./event-rules.js";

export { MOUNT_FAILURE_HISTORY } from "./event-rules.js";

/** How many diagnostics a snapshot keeps (the newest ones); `diagnosticsTotal` counts them all. */
export const MAX_DIAGNOSTICS = 100;

/** One line of a journal file (`<id>.jsonl`), in the seed's on-disk format. */
export interface JournalEntry {
  seq: number;
  id: string;
  type: string;
  ts: string;
  event: Record<string, unknown>;
  [extra: string]: unknown;
}

/** A note the reducer records instead of failing: an ignored event, a malformed ack, an error. */
export interface Diagnostic {
  /** What happened, e.g. `stale_checkpoint_ignored`, `unknown_event_type`, `journal_parse_failed`. */
  error: string;
  [detail: string]: unknown;
}

/** When an agent phase started (epoch ms) and how long it took, as the agent reported them. */
export interface GenerationTiming {
  at: number | null;
  durationMs: number | null;
}

/** A file attached to the session (today only the `screenshot` of a `generate`). */
export interface AnnotationArtifact {
  type: string;
  path: string;
}

/** A variant the browser failed to put on screen. */
export interface MountFailure {
  variant: number;
  url: string | null;
  error: string | null;
  at: number;
}

/**
 * What the browser actually got on screen: `pending` (published, nothing acked yet), `mounted`
 * (at least one variant reached the DOM; one success outranks any number of failures), `failed`
 * (failures and no success), or null (nothing published).
 */
export type RenderState = "pending" | "mounted" | "failed" | null;

/** The state derived from a session's journal; every field of the seed's snapshot. */
export type SessionSnapshot = {
  id: string;
  phase: string;
  pageUrl: string | null;
  sourceFile: string | null;
  previewFile: string | null;
  previewMode: string | null;
  expectedVariants: number;
  arrivedVariants: number;
  /** Can be NaN in memory (the seed's `Number(variantId)`); JSON files hold null then. */
  visibleVariant: number | null;
  paramValues: Record<string, unknown>;
  pendingEventSeq: number | null;
  /** The event the agent still owes a reply to, without its `token`. */
  pendingEvent: Record<string, unknown> | null;
  deliveryLease: unknown;
  /** Compatibility mirror of `browserCheckpointRevision` for older readers. */
  checkpointRevision: number;
  browserCheckpointRevision: number;
  publicationCheckpointRevision: number;
  activeOwner: string | null;
  sourceMarkers: Record<string, unknown>;
  fallbackMode: string | null;
  generationPhase: string | null;
  /** Set once generation finishes and never cleared by a later checkpoint. */
  generationCompletedAt: number | null;
  generationTimings: Record<string, GenerationTiming>;
  variantPlan: unknown;
  generationCanceled: boolean;
  generationCanceledAt: number | null;
  cancelReason: "accept" | "discard" | null;
  annotationArtifacts: AnnotationArtifact[];
  mountedVariants: number[];
  mountFailures: MountFailure[];
  renderState: RenderState;
  /** The newest {@link MAX_DIAGNOSTICS} diagnostics, oldest first. */
  diagnostics: Diagnostic[];
  /** Every diagnostic ever recorded; present only once more than MAX_DIAGNOSTICS were. */
  diagnosticsTotal?: number;
  updatedAt: string | null;
  /** Present once a `detector_waivers` event was accepted. */
  detectorWaivers?: unknown[];
  /** Present once a `steer_done` event arrived (possibly undefined, as in the seed). */
  message?: unknown;
  [extra: string]: unknown;
};

/** Options of {@link applyEvent} and {@link createReplay}. */
export interface ReducerOptions {
  /**
   * The wall clock, in epoch ms. Used only where the seed reads the clock: an entry without `ts`
   * (its `updatedAt`) and completion/cancel/failure times of entries whose `ts` does not parse.
   */
  now?: () => number;
}

/** The snapshot of a session with no events. */
export function baseSnapshot(id: string): SessionSnapshot {
  return {
    id,
    phase: "new",
    pageUrl: null,
    sourceFile: null,
    previewFile: null,
    previewMode: null,
    expectedVariants: 0,
    arrivedVariants: 0,
    visibleVariant: null,
    paramValues: {},
    pendingEventSeq: null,
    pendingEvent: null,
    deliveryLease: null,
    checkpointRevision: 0,
    browserCheckpointRevision: 0,
    publicationCheckpointRevision: 0,
    activeOwner: null,
    sourceMarkers: {},
    fallbackMode: null,
    generationPhase: null,
    generationCompletedAt: null,
    generationTimings: {},
    variantPlan: null,
    generationCanceled: false,
    generationCanceledAt: null,
    cancelReason: null,
    annotationArtifacts: [],
    mountedVariants: [],
    mountFailures: [],
    renderState: null,
    diagnostics: [],
    updatedAt: null,
  };
}

/**
 * The snapshot after one journal entry. Pure: the input snapshot is never mutated (the result
 * shares unchanged leaves with it, as the seed's does). `entry` is a journal entry
 * `{seq, id, type, ts, event}`; a bare event is accepted too (the seed's `entry.event || entry`).
 */
export function applyEvent(snapshot: SessionSnapshot, entry: JournalEntry | Record<string, unknown>, options: ReducerOptions = {}): SessionSnapshot {
  const now = options.now ?? Date.now;
  const record = entry as Loose;
  const next = copyForUpdate(snapshot as Loose);
  next.updatedAt = record.ts || isoNow(now);
  const before = (next.diagnostics as Diagnostic[]).length;
  const recorded = typeof snapshot.diagnosticsTotal === "number" && snapshot.diagnosticsTotal >= before ? snapshot.diagnosticsTotal : before;
  reduceInto(next, record, record.event || record, { now, waiversOwned: false, deferPending: false, pendingIsRaw: false });
  settleDiagnostics(next, recorded + (next.diagnostics as Diagnostic[]).length - before);
  return next as SessionSnapshot;
}

/** The mutable fast path of a full replay; see {@link createReplay}. */
export interface Replay {
  /**
   * Folds one parsed journal entry (an object) into the state. The entry is read, never
   * changed, and must not be changed by the caller either until the next `snapshot()`.
   */
  apply(entry: JournalEntry | Record<string, unknown>): void;
  /**
   * Records a journal line that could not be read (1-based line number, the parser's message).
   * As in the seed, these diagnostics come after every event's diagnostics, whatever the order
   * of the calls: they are appended by the next `snapshot()`.
   */
  parseFailure(line: number, message: string): void;
  /**
   * The state so far. The replay may go on afterwards without changing the returned object: the
   * next `apply` copies before it writes again.
   */
  snapshot(): SessionSnapshot;
}

/**
 * The reducer as a journal backend is given it: journal/ imports the core's types only, and gets
 * the rules themselves at construction (create-session-store.ts passes {@link sessionReducer}).
 */
export interface SessionReducer {
  /** How many diagnostics a snapshot keeps ({@link MAX_DIAGNOSTICS}). */
  readonly maxDiagnostics: number;
  baseSnapshot(id: string): SessionSnapshot;
  applyEvent(snapshot: SessionSnapshot, entry: JournalEntry | Record<string, unknown>, options?: ReducerOptions): SessionSnapshot;
  createReplay(id: string, options?: ReducerOptions): Replay;
}

/**
 * A replay of a journal from the start that updates one object in place instead of copying the
 * snapshot for every entry (the seed's copy per entry made a 100,000-entry replay take ~650 ms).
 * The result is deep-equal to folding {@link applyEvent} over the same entries from
 * {@link baseSnapshot}, followed by the parse diagnostics.
 */
export function createReplay(id: string, options: ReducerOptions = {}): Replay {
  const now = options.now ?? Date.now;
  let state: Loose = baseSnapshot(id);
  let handedOut = false;
  const context: ReduceContext = { now, waiversOwned: false, deferPending: true, pendingIsRaw: false };
  let total = 0;
  let parseDiagnostics: Diagnostic[] = [];
  let parseTotal = 0;

  return {
    apply(entry) {
      const record = entry as Loose;
      if (handedOut) {
        state = copyForUpdate(state);
        context.waiversOwned = false;
        handedOut = false;
      } else if (!state.variantPlan) {
        // The seed's per-entry copy turns a falsy plan (`plan: false`) into null on the next entry.
        state.variantPlan = null;
      }
      state.updatedAt = record.ts || isoNow(now);
      const diagnostics = state.diagnostics as Diagnostic[];
      const before = diagnostics.length;
      reduceInto(state, record, record.event || record, context);
      const after = (state.diagnostics as Diagnostic[]).length;
      if (after !== before) {
        total += after - before;
        // Trimming lazily, at twice the bound, keeps a long run of ignored events O(1) each.
        if (after > 2 * MAX_DIAGNOSTICS) diagnostics.splice(0, after - MAX_DIAGNOSTICS);
        if (total > MAX_DIAGNOSTICS) state.diagnosticsTotal = total;
      }
    },
    parseFailure(line, message) {
      parseDiagnostics.push({ error: "journal_parse_failed", line, message });
      parseTotal += 1;
      if (parseDiagnostics.length > 2 * MAX_DIAGNOSTICS) {
        parseDiagnostics.splice(0, parseDiagnostics.length - MAX_DIAGNOSTICS);
      }
    },
    snapshot() {
      if (parseTotal > 0) {
        if (handedOut) {
          state = copyForUpdate(state);
          context.waiversOwned = false;
        }
        (state.diagnostics as Diagnostic[]).push(...parseDiagnostics);
        total += parseTotal;
        parseDiagnostics = [];
        parseTotal = 0;
      }
      if (context.pendingIsRaw) {
        if (state.pendingEvent) state.pendingEvent = toPendingEvent(state.pendingEvent);
        context.pendingIsRaw = false;
      }
      settleDiagnostics(state, total);
      handedOut = true;
      return state as SessionSnapshot;
    },
  };
}

/** This module's rules, for the journal backends. */
export const sessionReducer: SessionReducer = { maxDiagnostics: MAX_DIAGNOSTICS, baseSnapshot, applyEvent, createReplay };

function isoNow(now: () => number): string {
  return new Date(now()).toISOString();
}

/**
 * The seed's copy of a snapshot before an entry is applied: every container the reducer writes
 * into is copied (and normalised: a missing one becomes empty), everything else is shared.
 * `updatedAt` keeps its key position; the caller sets its value.
 */
function copyForUpdate(snapshot: Loose): Loose {
  return {
    ...snapshot,
    paramValues: { ...(snapshot.paramValues || {}) },
    sourceMarkers: { ...(snapshot.sourceMarkers || {}) },
    generationTimings: { ...(snapshot.generationTimings || {}) },
    variantPlan: snapshot.variantPlan || null,
    annotationArtifacts: [...(snapshot.annotationArtifacts || [])],
    mountedVariants: [...(snapshot.mountedVariants || [])],
    mountFailures: [...(snapshot.mountFailures || [])],
    renderState: snapshot.renderState ?? null,
    diagnostics: [...(snapshot.diagnostics || [])],
    updatedAt: snapshot.updatedAt,
  };
}

/** Keeps the newest MAX_DIAGNOSTICS and records the total once it exceeds them. */
function settleDiagnostics(snapshot: Loose, total: number): void {
  const diagnostics = snapshot.diagnostics as Diagnostic[];
  if (diagnostics.length > MAX_DIAGNOSTICS) diagnostics.splice(0, diagnostics.length - MAX_DIAGNOSTICS);
  if (total > MAX_DIAGNOSTICS || Object.hasOwn(snapshot, "diagnosticsTotal")) {
    snapshot.diagnosticsTotal = total;
  }
}
