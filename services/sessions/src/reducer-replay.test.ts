import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { applyEvent, baseSnapshot, createReplay, MAX_DIAGNOSTICS, type SessionSnapshot } from "./reducer.js";
import { foldJournalText, replayJournalText } from "./fixtures/journal-text.js";
import { T0, now, iso, type Event, entries, reduce, generate } from "./reducer-fixtures.js";

describe("diagnostics bound", () => {
  const stale = (n: number): Event[] => [{ type: "checkpoint", revision: 1000 }, ...Array.from({ length: n }, (_, i) => ({ type: "checkpoint", revision: i }))];

  it(`has no total while at most ${MAX_DIAGNOSTICS} were recorded: the seed's snapshot exactly`, () => {
    const s = reduce(stale(MAX_DIAGNOSTICS));
    expect(s.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(s).not.toHaveProperty("diagnosticsTotal");
  });

  it(`keeps the newest ${MAX_DIAGNOSTICS} and counts them all`, () => {
    const s = reduce(stale(450));
    expect(s.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(s.diagnostics[0]).toStrictEqual({ error: "stale_checkpoint_ignored", revision: 350, revisionDomain: "browser" });
    expect(s.diagnostics.at(-1)).toMatchObject({ revision: 449 });
    expect(s.diagnosticsTotal).toBe(450);
  });

  it("bounds a snapshot that came with more (a seed snapshot file) and counts them", () => {
    const seedSnapshot = { ...baseSnapshot("s"), diagnostics: Array.from({ length: 300 }, (_, i) => ({ error: "e", i })) };
    const s = applyEvent(seedSnapshot, { seq: 301, id: "s", type: "bogus", ts: iso(T0), event: { type: "bogus" } });
    expect(s.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(s.diagnostics[0]).toStrictEqual({ error: "e", i: 201 });
    expect(s.diagnostics.at(-1)).toStrictEqual({ error: "unknown_event_type", type: "bogus" });
    expect(s.diagnosticsTotal).toBe(301);
    expect(seedSnapshot.diagnostics).toHaveLength(300);
    // Once present, the total keeps counting.
    const t = applyEvent(s, { seq: 302, id: "s", type: "steer", ts: iso(T0), event: { type: "steer" } });
    expect(t.diagnosticsTotal).toBe(301);
    expect(applyEvent(t, { seq: 303, id: "s", type: "x", ts: iso(T0), event: { type: "x" } }).diagnosticsTotal).toBe(302);
  });

  it("places parse failures after every event's diagnostics, within the bound", () => {
    const replay = createReplay("s", { now });
    replay.apply({ seq: 1, ts: iso(T0), event: { type: "bogus" } });
    replay.parseFailure(2, "Unexpected end of JSON input");
    replay.apply({ seq: 3, ts: iso(T0), event: { type: "other" } });
    expect(replay.snapshot().diagnostics).toStrictEqual([
      { error: "unknown_event_type", type: "bogus" },
      { error: "unknown_event_type", type: "other" },
      { error: "journal_parse_failed", line: 2, message: "Unexpected end of JSON input" },
    ]);

    const many = createReplay("s", { now });
    for (let line = 1; line <= 150; line++) many.parseFailure(line, "bad");
    for (let i = 0; i < 120; i++) many.apply({ ts: iso(T0), event: { type: "bogus" } });
    const s = many.snapshot();
    expect(s.diagnosticsTotal).toBe(270);
    expect(s.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(s.diagnostics.every((d) => d.error === "journal_parse_failed")).toBe(true);
    expect(s.diagnostics[0]).toMatchObject({ line: 51 });
  });
});

describe("createReplay", () => {
  it("hands out snapshots that later entries do not change", () => {
    const replay = createReplay("s", { now });
    const list = entries([generate, { type: "detector_waivers", waivers: ["a"] }, { type: "variants_ready" }, { type: "variant_mounted", variant: 1 }]);
    replay.apply(list[0]!);
    replay.apply(list[1]!);
    const early = replay.snapshot();
    const copy = structuredClone(early);
    replay.apply(list[2]!);
    replay.apply(list[3]!);
    replay.apply({ seq: 5, ts: iso(T0), event: { type: "detector_waivers", waivers: ["b"] } });
    replay.parseFailure(9, "bad");
    const late = replay.snapshot();
    expect(early).toStrictEqual(copy);
    expect(late.mountedVariants).toStrictEqual([1]);
    expect(late.detectorWaivers).toStrictEqual(["a", "b"]);
    expect(late.diagnostics).toStrictEqual([{ error: "journal_parse_failed", line: 9, message: "bad" }]);
    expect(replay.snapshot()).toStrictEqual(late); // a second call adds nothing
  });

  it("starts from the base snapshot", () => {
    expect(createReplay("x").snapshot()).toStrictEqual(baseSnapshot("x"));
  });
});

describe("fixtures in the seed's on-disk format", () => {
  const dir = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "journals");
  const names = readdirSync(dir)
    .filter((name) => name.endsWith(".jsonl"))
    .map((name) => name.slice(0, -".jsonl".length));

  it("are there", () => {
    expect(names.length).toBeGreaterThanOrEqual(6);
  });

  /** A parse failure's message comes from the runtime's JSON parser, which varies by version. */
  function withRuntimeParseMessages(expected: SessionSnapshot, text: string): SessionSnapshot {
    const lines = text.split("\n");
    const diagnostics = expected.diagnostics.map((d) => {
      if (d.error !== "journal_parse_failed" || d.message === "entry is not object") return d;
      try {
        JSON.parse(lines[(d.line as number) - 1] ?? "");
        return d;
      } catch (err) {
        return { ...d, message: (err as Error).message };
      }
    });
    return { ...expected, diagnostics };
  }

  it.each(names)("%s gives its expected snapshot through both paths", (name) => {
    const text = readFileSync(join(dir, `${name}.jsonl`), "utf8");
    const expected = withRuntimeParseMessages(JSON.parse(readFileSync(join(dir, `${name}.expected.json`), "utf8")), text);
    // A clock reading shows as a 2030 time in a field the expected snapshot does not have.
    const replayed = replayJournalText(name, text, { now });
    const folded = foldJournalText(name, text, { now });
    expect(folded).toStrictEqual(replayed);
    // As persisted: the same JSON, byte for byte, key order included.
    expect(JSON.stringify(replayed)).toBe(JSON.stringify(expected));
  });
});
