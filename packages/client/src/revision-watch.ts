/**
 * What the watches numbered by revision share (WatchLocks, WatchBudget): a stream of `event`,
 * `caught_up` and `progress` messages, each naming a revision, resumed after the service ended it
 * for falling behind (RESOURCE_EXHAUSTED WATCHER_LAGGED) from the revision the error names.
 */
import { Code } from "@connectrpc/connect";
import { ANY_CALL_REASONS, BerthClientError } from "./errors.js";
import { linkedCall, type CallOptions } from "./options.js";

/** What a revision watch yields: a change (or part of the current state), its end, progress, a resume. */
export type RevisionWatchEvent<E> =
  | { readonly kind: "event"; readonly event: E }
  /**
   * The current state or the changes replayed end here; `reset`: they replace the caller's view.
   * `queueSize` (WatchBudget, with the current state): how many requests were queued then.
   */
  | { readonly kind: "caughtUp"; readonly revision: bigint; readonly reset: boolean; readonly queueSize?: number | undefined }
  | { readonly kind: "progress"; readonly revision: bigint }
  /** The service ended the watch for falling behind; it goes on after `revision`, nothing missed. */
  | { readonly kind: "resumed"; readonly revision: bigint; readonly error: BerthClientError };

/** A message of a revision watch, as WatchLocksResponse and WatchBudgetResponse both are. */
export interface RevisionWatchMessage<E extends { readonly revision: bigint }> {
  readonly kind:
    | { readonly case: "event"; readonly value: E }
    | { readonly case: "caughtUp"; readonly value: { readonly revision: bigint; readonly reset: boolean; readonly queueSize?: number | undefined } }
    | { readonly case: "progress"; readonly value: { readonly revision: bigint } }
    /** Several parts of the current state at once (WatchBudget's `max_batch`). */
    | { readonly case: "events"; readonly value: { readonly events: readonly E[] } }
    | { readonly case: undefined; readonly value?: undefined };
}

/** Options every revision watch takes. */
export interface RevisionWatchOptions extends CallOptions {
  /** Describe the current state first, then `caughtUp`. */
  readonly includeCurrent?: boolean | undefined;
  /** Resume after this revision (the last one received). */
  readonly startRevision?: bigint | number | undefined;
  /** A `progress` whenever this long passed without another message (at least 100 ms). */
  readonly progressIntervalMs?: number | undefined;
  /** Resume by itself when the service ends the watch for falling behind (default true). */
  readonly resume?: boolean | undefined;
}

/** How one revision watch opens its stream and reads where a lag error says to resume. */
export interface RevisionWatchSource<E extends { readonly revision: bigint }> {
  open(start: { readonly startRevision: bigint; readonly includeCurrent: boolean }, signal: AbortSignal): AsyncIterable<RevisionWatchMessage<E>>;
  /** The revision a WATCHER_LAGGED error names to watch again from; undefined: not resumable. */
  resumeRevision(error: BerthClientError): bigint | undefined;
}

/**
 * Follows a revision watch until the loop breaks or the signal aborts. The revision reached is kept
 * from every event, `caughtUp` (a reset one's even when lower: a new run's may be) and `progress`;
 * a lag resumes from the revision the error names (the last one the service handed on whole),
 * after a `resumed` event, without asking for the current state again (it would win over the
 * revision). A resumed stream that lags again before handing on anything, from the same revision,
 * throws instead: the service cannot replay it to this client, and resuming again would spin.
 */
export async function* followRevisionWatch<E extends { readonly revision: bigint }>(
  source: RevisionWatchSource<E>,
  options: RevisionWatchOptions,
): AsyncGenerator<RevisionWatchEvent<E>> {
  let startRevision = BigInt(options.startRevision ?? 0);
  let includeCurrent = options.includeCurrent ?? false;
  let resumedFrom: bigint | undefined;
  // One deadline for the whole watch, however often it resumes; the stream ends with the loop.
  const call = linkedCall(options);
  try {
    for (;;) {
      let handedOn = false;
      try {
        for await (const message of source.open({ startRevision, includeCurrent }, call.controller.signal)) {
          const kind = message.kind;
          if (kind.case === undefined) continue;
          handedOn = true;
          if (kind.case === "events") {
            for (const event of kind.value.events) {
              if (event.revision > startRevision) startRevision = event.revision;
              yield { kind: "event", event };
            }
            continue;
          }
          const revision = kind.value.revision;
          if (revision > startRevision || (kind.case === "caughtUp" && kind.value.reset)) startRevision = revision;
          if (kind.case === "event") yield { kind: "event", event: kind.value };
          else if (kind.case === "caughtUp") {
            const { reset, queueSize } = kind.value;
            yield queueSize === undefined ? { kind: "caughtUp", revision, reset } : { kind: "caughtUp", revision, reset, queueSize };
          } else yield { kind: "progress", revision };
        }
        return;
      } catch (caught) {
        const error = BerthClientError.from(caught);
        const lagged = error.code === Code.ResourceExhausted && error.reason === ANY_CALL_REASONS.WATCHER_LAGGED;
        const resumeFrom = lagged && options.resume !== false && !call.controller.signal.aborted ? source.resumeRevision(error) : undefined;
        if (resumeFrom === undefined || (resumeFrom === resumedFrom && !handedOn)) throw error;
        startRevision = resumedFrom = resumeFrom;
        // Zero names no revision to replay from: only the current state leaves no gap then.
        includeCurrent = includeCurrent && resumeFrom === 0n;
        yield { kind: "resumed", revision: resumeFrom, error };
      }
    }
  } finally {
    call.dispose();
    call.controller.abort();
  }
}
