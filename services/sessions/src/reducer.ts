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
 * The conversions the rules make the seed's way (`Number`, comparisons, `Date.parse`) are in
 * seed-coercions.ts; here are the rules.
 */
import { comparable, isUnconvertible, parseEntryTime, toNumber } from "./seed-coercions.js";
import { isGenerationFencedPhase } from "./vocabulary.js";

/** How many diagnostics a snapshot keeps (the newest ones); `diagnosticsTotal` counts them all. */
export const MAX_DIAGNOSTICS = 100;

/**
 * How many mount failures a snapshot keeps. The browser card shows the newest; the agent needs
 * enough history to spot a variant that fails every republish, not the whole retry storm.
 */
export const MOUNT_FAILURE_HISTORY = 5;

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

// The seed's rules are JavaScript over untrusted JSON. The working copy is typed loosely on
// purpose so that `??`, `||`, `>=` and property writes keep exactly their JavaScript meaning on
// whatever values a journal holds; the public types above describe well-formed sessions.
// biome-ignore lint/suspicious/noExplicitAny: the seed reads event fields of any JSON type, and so do its rules
type Loose = Record<string, any>;

interface ReduceContext {
  now: () => number;
  /** Whether `detectorWaivers` of the working copy is an array this fold created (so may grow). */
  waiversOwned: boolean;
  /**
   * Replay only: `pendingEvent` holds the event itself until the snapshot is handed out, since
   * most pending events are replaced before anyone sees them and the copy without the token is
   * the costliest step of a replayed entry. The reducer only ever tests it for truthiness.
   */
  deferPending: boolean;
  /** Whether the working copy's non-null `pendingEvent` is such an event, not yet copied. */
  pendingIsRaw: boolean;
}

function pendingOf(event: Loose, context: ReduceContext): Record<string, unknown> {
  if (!context.deferPending) return toPendingEvent(event);
  context.pendingIsRaw = true;
  return event;
}

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

/** `at` if the event gave one, else the entry's time, else `fallback()` (the seed's `||`). */
function eventTime(event: Loose, entry: Loose, fallback: () => unknown): unknown {
  return event.at ?? (parseEntryTime(entry.ts || "") || fallback());
}

const noTime = (): null => null;

/**
 * Applies one event to a working copy whose containers (paramValues, sourceMarkers,
 * generationTimings, annotationArtifacts, mountedVariants, mountFailures, diagnostics) the caller
 * owns; `updatedAt` is already set. Mirrors the seed's `switch` case by case.
 */
function reduceInto(next: Loose, entry: Loose, event: Loose, context: ReduceContext): void {
  const diagnostics = next.diagnostics as Diagnostic[];
  switch (event.type) {
    case "generate":
      next.phase = "generate_requested";
      next.pageUrl = event.pageUrl ?? next.pageUrl;
      next.expectedVariants = event.count ?? next.expectedVariants;
      next.pendingEventSeq = entry.seq ?? next.pendingEventSeq;
      next.pendingEvent = pendingOf(event, context);
      next.variantPlan = null;
      // A new cycle publishes new files: what the browser said about the previous batch is now
      // about modules that no longer exist.
      next.mountedVariants = [];
      next.mountFailures = [];
      next.renderState = null;
      if (event.screenshotPath) {
        addArtifact(next.annotationArtifacts, { type: "screenshot", path: event.screenshotPath });
      }
      break;

    case "variant_plan":
      if (!next.generationCanceled && !isGenerationFencedPhase(next.phase)) {
        next.variantPlan = event.plan ?? next.variantPlan;
      }
      break;

    case "detector_waivers":
      if (!next.generationCanceled && !isGenerationFencedPhase(next.phase)) {
        const added = Array.isArray(event.waivers) ? (event.waivers as unknown[]) : [];
        if (context.waiversOwned && Array.isArray(next.detectorWaivers)) {
          for (const waiver of added) next.detectorWaivers.push(waiver);
        } else {
          next.detectorWaivers = [...(next.detectorWaivers || []), ...added];
          context.waiversOwned = true;
        }
      }
      break;

    case "agent_phase":
      next.generationPhase = event.phase ?? next.generationPhase;
      if (event.phase && !isUnconvertible(event.phase)) {
        next.generationTimings[event.phase] = {
          at: eventTime(event, entry, noTime),
          durationMs: event.durationMs ?? null,
        };
      }
      break;

    case "variants_ready":
    case "agent_done": {
      // After accept/discard a late batch must not move the session back; the one exception is
      // the agent reporting, after an accept, that the accepted variant still needs carbonizing.
      const carbonizeAfterAccept = event.type === "agent_done" && event.carbonize === true && next.phase === "accept_requested";
      if ((next.generationCanceled || isGenerationFencedPhase(next.phase)) && !carbonizeAfterAccept) {
        diagnostics.push({ error: "late_generation_event_ignored", type: event.type, phase: next.phase });
        break;
      }
      next.phase = event.carbonize === true ? "carbonize_required" : "variants_ready";
      // Monotone completion marker: a resumed browser's checkpoint may move `phase` back to
      // "generating", but the server keys missed-`done` redelivery on this staying set.
      next.generationCompletedAt = eventTime(event, entry, context.now);
      next.sourceFile = event.sourceFile ?? event.file ?? next.sourceFile;
      next.previewFile = event.previewFile ?? next.previewFile;
      next.previewMode = event.previewMode ?? next.previewMode;
      next.arrivedVariants = event.arrivedVariants ?? (next.expectedVariants || next.arrivedVariants || 0);
      next.pendingEventSeq = null;
      next.pendingEvent = null;
      if (event.carbonize === true) {
        diagnostics.push({
          error: "carbonize_cleanup_required",
          file: event.file || null,
          message: "Accepted variant still has carbonize markers that must be folded into source CSS.",
        });
      }
      next.renderState = deriveRenderState(next);
      break;
    }

    case "variant_mounted": {
      const variant = toNumber(event.variant);
      if (!Number.isInteger(variant) || variant < 1) {
        diagnostics.push({ error: "malformed_mount_ack", type: event.type, variant: event.variant ?? null });
        break;
      }
      const mounted = next.mountedVariants as number[];
      if (!mounted.includes(variant)) {
        mounted.push(variant);
        mounted.sort((a, b) => a - b);
      }
      next.renderState = deriveRenderState(next);
      break;
    }

    case "variant_mount_failed": {
      const variant = toNumber(event.variant);
      if (!Number.isInteger(variant) || variant < 1) {
        diagnostics.push({ error: "malformed_mount_ack", type: event.type, variant: event.variant ?? null });
        break;
      }
      const failures = next.mountFailures as unknown[];
      failures.push({
        variant,
        url: typeof event.url === "string" ? event.url : null,
        error: typeof event.error === "string" ? event.error : null,
        at: eventTime(event, entry, context.now),
      });
      if (failures.length > MOUNT_FAILURE_HISTORY) failures.splice(0, failures.length - MOUNT_FAILURE_HISTORY);
      next.renderState = deriveRenderState(next);
      // The failure needs an agent reply and must survive a helper restart like a generate does,
      // but never clobbers a pending generate (a progressive publish can fail an early mount
      // while the generate itself is still leased).
      if (!next.pendingEvent) next.pendingEvent = pendingOf(event, context);
      break;
    }

    case "checkpoint":
      applyCheckpoint(next, event, diagnostics);
      break;

    case "accept":
    case "accept_intent":
      next.phase = "accept_requested";
      next.generationCanceled = true;
      next.generationCanceledAt = eventTime(event, entry, context.now);
      next.cancelReason = "accept";
      // NaN when variantId is not numeric, as in the seed; JSON files then hold null.
      next.visibleVariant = toNumber(event.variantId ?? next.visibleVariant);
      if (event.paramValues) next.paramValues = { ...event.paramValues };
      next.pendingEventSeq = entry.seq ?? next.pendingEventSeq;
      next.pendingEvent = pendingOf(event, context);
      break;

    case "manual_edit_apply":
      next.phase = "manual_edit_apply_requested";
      next.pageUrl = event.pageUrl ?? next.pageUrl;
      next.pendingEventSeq = entry.seq ?? next.pendingEventSeq;
      next.pendingEvent = pendingOf(event, context);
      break;

    case "steer":
      next.phase = "steer_requested";
      next.pageUrl = event.pageUrl ?? next.pageUrl;
      next.pendingEventSeq = entry.seq ?? next.pendingEventSeq;
      next.pendingEvent = pendingOf(event, context);
      break;

    case "carbonize_cleanup":
      next.phase = "carbonize_cleanup_requested";
      next.sourceFile = event.file ?? next.sourceFile;
      next.pendingEventSeq = entry.seq ?? next.pendingEventSeq;
      next.pendingEvent = pendingOf(event, context);
      break;

    case "steer_done":
      next.phase = "steer_done";
      next.sourceFile = event.sourceFile ?? event.file ?? next.sourceFile;
      next.previewFile = event.previewFile ?? next.previewFile;
      next.previewMode = event.previewMode ?? next.previewMode;
      // Creates the key even when both are undefined, as the seed does.
      next.message = event.message ?? next.message;
      next.pendingEventSeq = null;
      next.pendingEvent = null;
      break;

    case "discard":
      next.phase = "discard_requested";
      next.generationCanceled = true;
      next.generationCanceledAt = eventTime(event, entry, context.now);
      next.cancelReason = "discard";
      next.pendingEventSeq = entry.seq ?? next.pendingEventSeq;
      next.pendingEvent = pendingOf(event, context);
      break;

    case "discarded":
      next.phase = "discarded";
      next.pendingEventSeq = null;
      next.pendingEvent = null;
      break;

    case "complete":
      next.phase = "completed";
      next.sourceFile = event.sourceFile ?? event.file ?? next.sourceFile;
      next.previewFile = event.previewFile ?? next.previewFile;
      next.previewMode = event.previewMode ?? next.previewMode;
      next.pendingEventSeq = null;
      next.pendingEvent = null;
      break;

    case "agent_error":
      // A generate that fails after the user accepted or discarded is old news.
      if (next.generationCanceled && event.sourceEventType === "generate") {
        diagnostics.push({ error: "late_generation_event_ignored", type: event.type, phase: next.phase });
        break;
      }
      next.phase = "agent_error";
      next.pendingEventSeq = null;
      next.pendingEvent = null;
      diagnostics.push({ error: "agent_error", message: event.message || "unknown agent error" });
      break;

    default:
      diagnostics.push({ error: "unknown_event_type", type: event.type });
      break;
  }
}

/**
 * A checkpoint reports state from one of two revision domains, each with its own counter:
 * `publication` (explicitly, or a `variants_progress` report with no owner: the agent publishing)
 * and `browser` (everything else: the page). A checkpoint older than its domain's counter is
 * stale and ignored; `checkpointRevision` mirrors the browser counter for older readers.
 */
function applyCheckpoint(next: Loose, event: Loose, diagnostics: Diagnostic[]): void {
  if (next.generationCanceled || isGenerationFencedPhase(next.phase)) {
    diagnostics.push({
      error: "checkpoint_after_terminal_ignored",
      phase: event.phase ?? null,
      revision: event.revision ?? null,
    });
    return;
  }
  const domain = event.revisionDomain === "publication" || (event.reason === "variants_progress" && !event.owner) ? "publication" : "browser";
  const field = domain === "publication" ? "publicationCheckpointRevision" : "browserCheckpointRevision";
  const current = next[field] ?? (domain === "browser" ? next.checkpointRevision : 0) ?? 0;
  // Plain JavaScript comparison, as in the seed, whatever type the revisions hold (but one that
  // cannot be compared at all is stale, not a failure).
  if (comparable(event.revision ?? 0) >= comparable(current)) {
    next.phase = event.phase ?? next.phase;
    next[field] = event.revision ?? current;
    if (domain === "browser") {
      next.checkpointRevision = event.revision ?? next.checkpointRevision;
      next.activeOwner = event.owner ?? next.activeOwner;
    }
    next.arrivedVariants = event.arrivedVariants ?? next.arrivedVariants;
    if (domain === "browser") next.visibleVariant = event.visibleVariant ?? next.visibleVariant;
    next.sourceFile = event.sourceFile ?? next.sourceFile;
    next.previewFile = event.previewFile ?? next.previewFile;
    next.previewMode = event.previewMode ?? next.previewMode;
    if (domain === "browser" && event.paramValues) next.paramValues = { ...event.paramValues };
  } else {
    diagnostics.push({ error: "stale_checkpoint_ignored", revision: event.revision, revisionDomain: domain });
  }
}

function deriveRenderState(snapshot: Loose): RenderState {
  if (snapshot.mountedVariants.length > 0) return "mounted";
  if (snapshot.mountFailures.length > 0) return "failed";
  if (snapshot.generationCompletedAt) return "pending";
  return null;
}

/** The event as the agent will see it: the delivery `token` is the server's, not the agent's. */
function toPendingEvent(event: Loose): Record<string, unknown> {
  // The same as the seed's copy-then-delete, without the delete that slows the copy down.
  if (!Object.hasOwn(event, "token")) return { ...event };
  const { token: _token, ...pending } = event;
  return pending;
}

/** Adds an artifact unless one with the same type and path is already attached. */
function addArtifact(artifacts: Loose[], artifact: { type: string; path: unknown }): void {
  if (!artifacts.some((existing) => existing.path === artifact.path && existing.type === artifact.type)) {
    artifacts.push(artifact);
  }
}
