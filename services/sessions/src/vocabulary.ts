/**
 * The session phases that carry meaning beyond the reducer itself. They are the values of the
 * public impeccable `vocabulary.mjs` the seed's session store imports but the seed does not include
 * (docs/architecture.md, "Glossary": the seed), so that berth and processes still using the seed
 * agree on the same journal.
 */

/** Phases that retire a session from the active list (`ListSessions` hides them unless asked). */
export const COMPLETED_SESSION_PHASES: readonly string[] = Object.freeze(["completed", "discarded"]);

/**
 * Phases after which a late generation event (`variants_ready`, `agent_done`, `variant_plan`,
 * `detector_waivers`, a browser `checkpoint`) is ignored: the user has already accepted or
 * discarded, so an agent still finishing the old batch must not move the session back.
 */
export const GENERATION_FENCED_SESSION_PHASES: readonly string[] = Object.freeze([
  "accept_requested",
  "discard_requested",
  "carbonize_required",
  "completed",
  "discarded",
]);

const completedPhases: ReadonlySet<unknown> = new Set(COMPLETED_SESSION_PHASES);
const fencedPhases: ReadonlySet<unknown> = new Set(GENERATION_FENCED_SESSION_PHASES);

/** True when a snapshot in this phase is retired (hidden from the active list). */
export function isCompletedPhase(phase: unknown): boolean {
  return completedPhases.has(phase);
}

/** True when a snapshot in this phase ignores late generation events (past the generation cutoff). */
export function isPastGenerationCutoff(phase: unknown): boolean {
  return fencedPhases.has(phase);
}
