/**
 * The machine samples a budget has taken, numbered, for its watchers: the latest ones kept so a
 * watcher that reconnects can be sent what it missed.
 */
import { RevisionHistory } from "@berth/shared/revision-history";
import { SAMPLE_HISTORY, type RevisionedSample } from "./budget-interface.js";
import type { MachineSample } from "./sampler.js";

export class SampleFeed {
  private readonly samples: RevisionHistory<MachineSample>;
  private readonly watchers = new Set<(sample: RevisionedSample | undefined) => void>();
  private closed = false;

  constructor(base: number, first: MachineSample | undefined) {
    this.samples = new RevisionHistory<MachineSample>({ base, capacity: SAMPLE_HISTORY });
    if (first !== undefined) this.samples.append(first);
  }

  /** Numbers `sample` and keeps it; {@link publish} sends it to the watchers. */
  record(sample: MachineSample): number {
    return this.samples.append(sample).revision;
  }

  /** Sends a recorded sample to every watcher. */
  publish(sample: MachineSample, revision: number): void {
    for (const watcher of this.watchers) watcher({ sample, revision, reset: false });
  }

  /** Ends every watch. */
  close(): void {
    this.closed = true;
    for (const watcher of [...this.watchers]) watcher(undefined);
  }

  /** See {@link Budget.watchMachine}. */
  watch(signal: AbortSignal | undefined, startRevision: number): AsyncIterable<RevisionedSample> {
    return {
      // An arrow: `this` stays the feed.
      [Symbol.asyncIterator]: (): AsyncIterator<RevisionedSample> => {
        const resuming = startRevision > 0 && this.samples.canReplay(startRevision);
        // The held samples after the start revision, each sent; live samples are states, so a
        // reader behind gets the newest one only.
        const replay: RevisionedSample[] = resuming
          ? this.samples.since(startRevision).map(({ revision, value }) => ({ sample: value, revision, reset: false }))
          : [];
        const latest = this.samples.last();
        // A start that cannot be continued is told on the first sample it gets (the latest, or the next one).
        let resetDue = startRevision > 0 && !resuming;
        let live: RevisionedSample | undefined =
          resuming || latest === undefined ? undefined : { sample: latest.value, revision: latest.revision, reset: resetDue };
        if (live !== undefined) resetDue = false;
        let ended = this.closed || signal?.aborted === true;
        let wake: (() => void) | undefined;
        const end = () => {
          ended = true;
          this.watchers.delete(watcher);
          wake?.();
        };
        const watcher = (sample: RevisionedSample | undefined) => {
          if (sample === undefined) return end();
          live = { ...sample, reset: resetDue || live?.reset === true };
          resetDue = false;
          wake?.();
        };
        if (!ended) {
          this.watchers.add(watcher);
          signal?.addEventListener("abort", end, { once: true });
        }
        return {
          async next(): Promise<IteratorResult<RevisionedSample>> {
            while (!ended && replay.length === 0 && live === undefined) await new Promise<void>((resolve) => (wake = resolve));
            wake = undefined;
            let sample = replay.shift();
            if (sample === undefined) {
              sample = live;
              live = undefined;
            } else if (live !== undefined && live.revision <= sample.revision) {
              live = undefined;
            }
            if (sample !== undefined && !ended) return { value: sample, done: false };
            end();
            return { value: undefined, done: true };
          },
          async return(): Promise<IteratorResult<RevisionedSample>> {
            end();
            signal?.removeEventListener("abort", end);
            return { value: undefined, done: true };
          },
        };
      },
    };
  }
}
