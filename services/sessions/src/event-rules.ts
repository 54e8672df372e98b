/**
 * The seed's rules, event by event: how one journal entry changes a working copy of the snapshot
 * (reducer.ts owns the copies, the replay and the diagnostics' bound). Each rule reproduces the
 * seed's case of `applyEvent` exactly; see reducer.ts for why.
 */
import { comparable, isUnconvertible, parseEntryTime, toNumber } from "./seed-coercions.js";
import { isPastGenerationCutoff } from "./vocabulary.js";

/**
 * How many mount failures a snapshot keeps. The browser card shows the newest; the agent needs
 * enough history to spot a variant that fails every republish, not the whole retry storm.
 */
export const MOUNT_FAILURE_HISTORY = 5;

// The seed's rules are JavaScript over untrusted JSON. The working copy is typed loosely on
// purpose so that `??`, `||`, `>=` and property writes keep exactly their JavaScript meaning on
// whatever values a journal holds; the public types above describe well-formed sessions.
// biome-ignore lint/suspicious/noExplicitAny: the seed reads event fields of any JSON type, and so do its rules
export type Loose = Record<string, any>;

export interface ReduceContext {
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

/** The request the agent has yet to answer: its seq and the event (keys in the seed's order). */
function setPending(next: Loose, entry: Loose, event: Loose, context: ReduceContext): void {
  next.pendingEventSeq = entry.seq ?? next.pendingEventSeq;
  next.pendingEvent = pendingOf(event, context);
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
export function reduceInto(next: Loose, entry: Loose, event: Loose, context: ReduceContext): void {
  const diagnostics = next.diagnostics as Loose[];
  switch (event.type) {
    case "generate":
      generateRequested(next, entry, event, context);
      break;

    case "variant_plan":
      if (!next.generationCanceled && !isPastGenerationCutoff(next.phase)) {
        next.variantPlan = event.plan ?? next.variantPlan;
      }
      break;

    case "detector_waivers":
      detectorWaiversAccepted(next, event, context);
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
    case "agent_done":
      generationDone(next, entry, event, context);
      break;

    case "variant_mounted":
      variantMounted(next, event);
      break;

    case "variant_mount_failed":
      variantMountFailed(next, entry, event, context);
      break;

    case "checkpoint":
      applyCheckpoint(next, event, diagnostics);
      break;

    case "accept":
    case "accept_intent":
      acceptRequested(next, entry, event, context);
      break;

    case "manual_edit_apply":
      next.phase = "manual_edit_apply_requested";
      next.pageUrl = event.pageUrl ?? next.pageUrl;
      setPending(next, entry, event, context);
      break;

    case "steer":
      next.phase = "steer_requested";
      next.pageUrl = event.pageUrl ?? next.pageUrl;
      setPending(next, entry, event, context);
      break;

    case "carbonize_cleanup":
      next.phase = "carbonize_cleanup_requested";
      next.sourceFile = event.file ?? next.sourceFile;
      setPending(next, entry, event, context);
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
      setPending(next, entry, event, context);
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
      agentError(next, event);
      break;

    default:
      diagnostics.push({ error: "unknown_event_type", type: event.type });
      break;
  }
}

/** A generate: a new cycle asked for, its pending event set. */
function generateRequested(next: Loose, entry: Loose, event: Loose, context: ReduceContext): void {
  next.phase = "generate_requested";
  next.pageUrl = event.pageUrl ?? next.pageUrl;
  next.expectedVariants = event.count ?? next.expectedVariants;
  setPending(next, entry, event, context);
  next.variantPlan = null;
  // A new cycle publishes new files: what the browser said about the previous batch is now
  // about modules that no longer exist.
  next.mountedVariants = [];
  next.mountFailures = [];
  next.renderState = null;
  if (event.screenshotPath) {
    addArtifact(next.annotationArtifacts, { type: "screenshot", path: event.screenshotPath });
  }
}

/** Detector waivers, added unless the generation is over. */
function detectorWaiversAccepted(next: Loose, event: Loose, context: ReduceContext): void {
  if (!next.generationCanceled && !isPastGenerationCutoff(next.phase)) {
    const added = Array.isArray(event.waivers) ? (event.waivers as unknown[]) : [];
    if (context.waiversOwned && Array.isArray(next.detectorWaivers)) {
      for (const waiver of added) next.detectorWaivers.push(waiver);
    } else {
      next.detectorWaivers = [...(next.detectorWaivers || []), ...added];
      context.waiversOwned = true;
    }
  }
}

/** The agent's batch is there (or it is done); ignored after accept/discard. */
function generationDone(next: Loose, entry: Loose, event: Loose, context: ReduceContext): void {
  const diagnostics = next.diagnostics as Loose[];
  // After accept/discard a late batch must not move the session back; the one exception is
  // the agent reporting, after an accept, that the accepted variant still needs carbonizing.
  const carbonizeAfterAccept = event.type === "agent_done" && event.carbonize === true && next.phase === "accept_requested";
  if ((next.generationCanceled || isPastGenerationCutoff(next.phase)) && !carbonizeAfterAccept) {
    diagnostics.push({ error: "late_generation_event_ignored", type: event.type, phase: next.phase });
    return;
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
}

/** The browser mounted a variant. */
function variantMounted(next: Loose, event: Loose): void {
  const diagnostics = next.diagnostics as Loose[];
  const variant = toNumber(event.variant);
  if (!Number.isInteger(variant) || variant < 1) {
    diagnostics.push({ error: "malformed_mount_ack", type: event.type, variant: event.variant ?? null });
    return;
  }
  const mounted = next.mountedVariants as number[];
  if (!mounted.includes(variant)) {
    mounted.push(variant);
    mounted.sort((a, b) => a - b);
  }
  next.renderState = deriveRenderState(next);
}

/** The browser failed to mount a variant: recorded, and owed a reply. */
function variantMountFailed(next: Loose, entry: Loose, event: Loose, context: ReduceContext): void {
  const diagnostics = next.diagnostics as Loose[];
  const variant = toNumber(event.variant);
  if (!Number.isInteger(variant) || variant < 1) {
    diagnostics.push({ error: "malformed_mount_ack", type: event.type, variant: event.variant ?? null });
    return;
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
}

/** The user accepted a variant: the generation ends. */
function acceptRequested(next: Loose, entry: Loose, event: Loose, context: ReduceContext): void {
  next.phase = "accept_requested";
  next.generationCanceled = true;
  next.generationCanceledAt = eventTime(event, entry, context.now);
  next.cancelReason = "accept";
  // NaN when variantId is not numeric, as in the seed; JSON files then hold null.
  next.visibleVariant = toNumber(event.variantId ?? next.visibleVariant);
  if (event.paramValues) next.paramValues = { ...event.paramValues };
  setPending(next, entry, event, context);
}

/** The agent failed; a generate's failure after accept/discard is old news. */
function agentError(next: Loose, event: Loose): void {
  const diagnostics = next.diagnostics as Loose[];
  // A generate that fails after the user accepted or discarded is old news.
  if (next.generationCanceled && event.sourceEventType === "generate") {
    diagnostics.push({ error: "late_generation_event_ignored", type: event.type, phase: next.phase });
    return;
  }
  next.phase = "agent_error";
  next.pendingEventSeq = null;
  next.pendingEvent = null;
  diagnostics.push({ error: "agent_error", message: event.message || "unknown agent error" });
}

/**
 * A checkpoint reports state from one of two revision domains, each with its own counter:
 * `publication` (explicitly, or a `variants_progress` report with no owner: the agent publishing)
 * and `browser` (everything else: the page). A checkpoint older than its domain's counter is
 * stale and ignored; `checkpointRevision` mirrors the browser counter for older readers.
 */
function applyCheckpoint(next: Loose, event: Loose, diagnostics: Loose[]): void {
  if (next.generationCanceled || isPastGenerationCutoff(next.phase)) {
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

function deriveRenderState(snapshot: Loose): "pending" | "mounted" | "failed" | null {
  if (snapshot.mountedVariants.length > 0) return "mounted";
  if (snapshot.mountFailures.length > 0) return "failed";
  if (snapshot.generationCompletedAt) return "pending";
  return null;
}

/** The event as the agent will see it: the delivery `token` is the server's, not the agent's. */
export function toPendingEvent(event: Loose): Record<string, unknown> {
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
