import { describe, expect, it } from "vitest";
import { RevisionHistory, runRevisionBase, type RevisionWatcher } from "./revision-history.js";

const lagged = (resumeRevision: number) => Object.assign(new Error("lagged"), { resumeRevision });

async function take<T>(watcher: RevisionWatcher<T>, count: number): Promise<Array<[number, T]>> {
  const out: Array<[number, T]> = [];
  for (let i = 0; i < count; i++) {
    const step = await watcher.next();
    if (step.done) break;
    out.push([step.value.revision, step.value.value]);
  }
  return out;
}

describe("RevisionHistory", () => {
  it("numbers changes from the base and replays exactly the ones after a revision", async () => {
    const history = new RevisionHistory<string>({ base: 1000, capacity: 4 });
    expect(history.revision).toBe(1000);
    for (const v of ["a", "b", "c"]) history.append(v);
    const watcher = history.watch(1001, { maxBuffered: 10, lagged });
    history.append("d");
    expect(await take(watcher, 3)).toEqual([
      [1002, "b"],
      [1003, "c"],
      [1004, "d"],
    ]);
    expect(watcher.lastTaken).toBe(1004);
  });

  it("cannot replay a revision older than it holds, below its base or ahead of its latest", () => {
    const history = new RevisionHistory<number>({ base: 50, capacity: 3 });
    for (let i = 0; i < 5; i++) history.append(i);
    expect(history.revision).toBe(55);
    expect(history.canReplay(52)).toBe(true);
    expect(history.canReplay(51)).toBe(false);
    expect(history.canReplay(49)).toBe(false);
    expect(history.canReplay(56)).toBe(false);
    expect(history.canReplay(55)).toBe(true);
    expect(() => history.watch(51, { maxBuffered: 10, lagged })).toThrow(RangeError);
  });

  it("ends a watcher that falls more than its bound behind with the last revision it took", async () => {
    const history = new RevisionHistory<number>({ base: 0, capacity: 100 });
    const watcher = history.watch(0, { maxBuffered: 2, lagged });
    history.append(1);
    expect(await take(watcher, 1)).toEqual([[1, 1]]);
    history.append(2);
    history.append(3);
    history.append(4);
    await expect(watcher.next()).rejects.toMatchObject({ resumeRevision: 1 });
    expect(history.watcherCount).toBe(0);
    // Resuming from there, with the same bound, misses nothing: the replay is not counted against it.
    expect(await take(history.watch(1, { maxBuffered: 2, lagged }), 3)).toEqual([
      [2, 2],
      [3, 3],
      [4, 4],
    ]);
  });

  it("replays more than its bound to a resumed watcher, then bounds the live changes it has not taken", async () => {
    const history = new RevisionHistory<number>({ base: 0, capacity: 100 });
    for (let i = 1; i <= 5; i++) history.append(i);
    const watcher = history.watch(0, { maxBuffered: 2, lagged });
    expect(await take(watcher, 1)).toEqual([[1, 1]]);
    // Four replayed changes unread and two live ones: within the bound.
    history.append(6);
    history.append(7);
    expect(await take(watcher, 5)).toEqual([
      [2, 2],
      [3, 3],
      [4, 4],
      [5, 5],
      [6, 6],
    ]);
    // 7 is unread: one more live change is within the bound, a second is past it.
    history.append(8);
    history.append(9);
    await expect(watcher.next()).rejects.toMatchObject({ resumeRevision: 6 });
  });

  it("wakes a waiting reader, and ends it on close after what it buffered", async () => {
    const history = new RevisionHistory<string>({ base: 0, capacity: 10 });
    const watcher = history.watch(0, { maxBuffered: 10, lagged });
    const pending = watcher.next();
    history.append("x");
    expect((await pending).value).toEqual({ revision: 1, value: "x" });
    history.append("y");
    history.close();
    expect(await take(watcher, 5)).toEqual([[2, "y"]]);
    expect(await watcher.next()).toEqual({ value: undefined, done: true });
  });

  it("forgets a watcher its reader returned", async () => {
    const history = new RevisionHistory<string>({ base: 0, capacity: 10 });
    const watcher = history.watch(0, { maxBuffered: 10, lagged });
    expect(history.watcherCount).toBe(1);
    await watcher.return();
    expect(history.watcherCount).toBe(0);
    expect(await watcher.next()).toEqual({ value: undefined, done: true });
  });

  it("keeps only what a watcher accepts, bounds it by those alone, and delivers past the skipped ones", async () => {
    const history = new RevisionHistory<string>({ base: 0, capacity: 100 });
    history.append("a1");
    history.append("b1");
    const watcher = history.watch(0, { maxBuffered: 2, lagged, accept: (value) => value.startsWith("a") });
    expect(watcher.buffered).toBe(1);
    expect(watcher.deliveredRevision).toBe(0);
    for (const value of ["b2", "b3", "b4", "a2"]) history.append(value);
    expect(await take(watcher, 2)).toEqual([
      [1, "a1"],
      [6, "a2"],
    ]);
    history.append("b5");
    expect(watcher.lastTaken).toBe(6);
    expect(watcher.deliveredRevision).toBe(7);
    history.append("a3");
    expect(watcher.deliveredRevision).toBe(6);
    history.append("a4");
    history.append("a5");
    await expect(watcher.next()).rejects.toMatchObject({ resumeRevision: 6 });
  });

  it("ends every watcher with the error it is closed with, dropping what it buffered, and refuses new ones", async () => {
    const history = new RevisionHistory<string>({ base: 0, capacity: 10 });
    const watcher = history.watch(0, { maxBuffered: 10, lagged });
    const pending = watcher.next();
    const idle = history.watch(0, { maxBuffered: 10, lagged });
    history.append("x");
    history.append("y");
    const shutdown = new Error("shutting down");
    history.close(shutdown);
    await expect(pending).rejects.toBe(shutdown);
    expect(await watcher.next()).toEqual({ value: undefined, done: true });
    await expect(idle.next()).rejects.toBe(shutdown);
    await expect(history.watch(2, { maxBuffered: 10, lagged }).next()).rejects.toBe(shutdown);
    expect(history.watcherCount).toBe(0);
  });

  it("starts a run's revisions at its start time in microseconds", () => {
    expect(runRevisionBase({ now: () => 1_700_000_000_123.7 })).toBe(1_700_000_000_123_000);
  });
});
