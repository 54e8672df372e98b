import { describe, expect, it } from "vitest";
import { BerthError } from "@berth/shared/errors";
import { PumpedWatcher } from "./pumped-watcher.js";

const lagged = () => new BerthError("resource_exhausted", "fell behind", {}, { reason: "WATCHER_LAGGED" });

/** A source that yields `items`, then throws `error` (naming the last item it handed over). */
async function* failing(items: number[], error: Error): AsyncGenerator<number> {
  yield* items;
  throw error;
}

async function readAll(watcher: PumpedWatcher<number>): Promise<{ items: number[]; error: unknown }> {
  const items: number[] = [];
  try {
    for (let step = await watcher.next(); !step.done; step = await watcher.next()) items.push(step.value);
  } catch (error) {
    return { items, error };
  }
  return { items, error: undefined };
}

describe("PumpedWatcher", () => {
  it("hands the reader what the source gave before the source's error, then the error", async () => {
    const cut = new Error("compacted after 3");
    const watcher = new PumpedWatcher<number>({ source: () => failing([1, 2, 3], cut), maxBuffered: 10, isLive: () => false, lagged });
    // The source has run to its error before the reader asks.
    await new Promise((resolve) => setImmediate(resolve));
    expect(watcher.takeBuffered(1)).toEqual([1]);
    expect(await readAll(watcher)).toEqual({ items: [2, 3], error: cut });
  });

  it("drops what is queued when failed from outside, and queues nothing after", async () => {
    let more!: () => void;
    const gate = new Promise<void>((resolve) => (more = resolve));
    const source = async function* () {
      yield 1;
      yield 2;
      await gate;
      yield 3;
    };
    const watcher = new PumpedWatcher<number>({ source, maxBuffered: 10, isLive: () => true, lagged });
    await new Promise((resolve) => setImmediate(resolve));
    const shutdown = new Error("shutting down");
    watcher.fail(shutdown);
    more();
    await new Promise((resolve) => setImmediate(resolve));
    expect(await readAll(watcher)).toEqual({ items: [], error: shutdown });
  });
});
