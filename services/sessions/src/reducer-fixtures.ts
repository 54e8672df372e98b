/**
 * For the reducer's tests: events made into journal entries stamped a second apart, folded both
 * ways (applyEvent one by one, and the replay fast path, which must agree), under a fixed clock.
 */
import { expect } from "vitest";
import { applyEvent, baseSnapshot, createReplay, type JournalEntry, type SessionSnapshot } from "./reducer.js";

export const T0 = Date.parse("2025-03-01T10:00:00.000Z");
/** The wall clock of these tests: far from every entry time, so a clock reading shows. */
export const NOW = Date.parse("2030-01-01T00:00:00.000Z");
export const now = (): number => NOW;
export const iso = (ms: number): string => new Date(ms).toISOString();

export type Event = Record<string, unknown>;

/** Entry n (from 1) is stamped T0 + (n - 1) seconds. */
export function entries(events: Event[]): JournalEntry[] {
  return events.map((event, i) => ({
    seq: i + 1,
    id: "s",
    type: String(event.type),
    ts: iso(T0 + i * 1000),
    event: { id: "s", ...event },
  }));
}

/** Folds the events with applyEvent, and checks that the replay fast path agrees. */
export function reduce(events: Event[]): SessionSnapshot {
  return reduceEntries(entries(events));
}

export function reduceEntries(list: Record<string, unknown>[]): SessionSnapshot {
  let snapshot = baseSnapshot("s");
  for (const entry of list) snapshot = applyEvent(snapshot, entry, { now });
  const replay = createReplay("s", { now });
  for (const entry of list) replay.apply(entry);
  expect(replay.snapshot()).toStrictEqual(snapshot);
  return snapshot;
}

export const generate: Event = { type: "generate", pageUrl: "http://localhost:5173/", count: 3, token: "lease-1" };
