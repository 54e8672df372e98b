import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { encodeJournalLine } from "./journal/journal-format.js";
import { applyEvent, baseSnapshot, type JournalEntry, type SessionSnapshot } from "./reducer.js";
import { dir, journal, open, readAll, seedLine, temporaryStores } from "./session-store-fixtures.js";

temporaryStores();

function makeLogger() {
  const lines: Array<{ level: string; obj: object; msg?: string }> = [];
  const at = (level: string) => (obj: object, msg?: string) => void lines.push({ level, obj, ...(msg ? { msg } : {}) });
  return { lines, debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

function fold(id: string, entries: JournalEntry[]): SessionSnapshot {
  return entries.reduce((snapshot, entry) => applyEvent(snapshot, entry), baseSnapshot(id));
}

describe("opening journals", () => {
  it("cuts a torn tail back, reports it, and continues at the right seq", async () => {
    const logger = makeLogger();
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    const whole = encodeJournalLine({ seq: 1, id: "s1", type: "generate", ts: "2026-01-01T00:00:00.000Z", event: { type: "generate", id: "s1" } });
    const torn = encodeJournalLine({ seq: 2, id: "s1", type: "agent_done", ts: "2026-01-01T00:00:01.000Z", event: { type: "agent_done", id: "s1" } }).slice(
      0,
      30,
    );
    fs.writeFileSync(journal("s1"), whole + torn);
    const store = open({ logger });
    const view = store.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(1);
    expect(view.snapshot.diagnostics).toContainEqual({ error: "journal_torn_tail_repaired", line: 2, bytesDropped: 30, entriesDropped: 0 });
    expect(fs.readFileSync(journal("s1"), "utf8")).toBe(whole);
    expect(logger.lines.some((l) => l.level === "warn" && /torn/.test(l.msg ?? ""))).toBe(true);
    const next = await store.append("s1", [{ type: "agent_done" }]);
    expect(next.firstSeq).toBe(2);
    expect(
      fs
        .readFileSync(journal("s1"), "utf8")
        .split("\n")
        .filter(Boolean)
        .map((l) => JSON.parse(l).seq),
    ).toEqual([1, 2]);
  });

  it("drops an append of several events that reached the disk only in part", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    await store.append("s1", [{ type: "agent_done" }, { type: "variant_mounted", variant: 1 }, { type: "variant_mounted", variant: 2 }]);
    await store.close();
    // Keep the first two of the three lines of the second append, as a crash could.
    const lines = fs.readFileSync(journal("s1"), "utf8").split("\n");
    fs.writeFileSync(journal("s1"), `${lines.slice(0, 3).join("\n")}\n`);
    fs.rmSync(path.join(dir, "sessions", "s1.snapshot.json"));
    const reopened = open();
    const view = reopened.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(1);
    expect(view.snapshot.phase).toBe("generate_requested");
    expect(view.snapshot.diagnostics).toContainEqual(expect.objectContaining({ error: "journal_torn_tail_repaired", entriesDropped: 2 }));
    expect(fs.readFileSync(journal("s1"), "utf8").trim().split("\n")).toHaveLength(1);
  });

  it("keeps a corrupt line in the middle as journal_parse_failed and replays the rest", async () => {
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    fs.writeFileSync(journal("s1"), `${seedLine(1, "s1", { type: "generate", count: 2 })}{"seq":2,"id":"s1","ty\n${seedLine(3, "s1", { type: "agent_done" })}`);
    const store = open();
    const view = store.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(3);
    expect(view.snapshot.phase).toBe("variants_ready");
    expect(view.snapshot.diagnostics).toEqual([expect.objectContaining({ error: "journal_parse_failed", line: 2 })]);
    expect(fs.readFileSync(journal("s1"), "utf8").split("\n")).toHaveLength(4);
  });

  it("skips a damaged line that still parses, with a checksum diagnostic", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate", count: 2 }]);
    await store.append("s1", [{ type: "checkpoint", revision: 1, phase: "generating" }]);
    await store.append("s1", [{ type: "agent_phase", phase: "plan" }]);
    await store.close();
    const text = fs.readFileSync(journal("s1"), "utf8");
    fs.writeFileSync(journal("s1"), text.replace('"revision":1', '"revision":7'));
    fs.rmSync(path.join(dir, "sessions", "s1.snapshot.json"));
    const reopened = open();
    const view = reopened.getSnapshot("s1")!;
    expect(view.snapshot.browserCheckpointRevision).toBe(0);
    expect(view.snapshot.generationPhase).toBe("plan");
    expect(view.snapshot.diagnostics).toEqual([expect.objectContaining({ error: "journal_checksum_mismatch", line: 2 })]);
    expect((await readAll(reopened, "s1")).map((e) => e.entry.seq)).toEqual([1, 3]);
  });

  it("reads hand-written seed-format fixtures with the expected snapshot", async () => {
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    const events = [
      { type: "generate", count: 3, pageUrl: "http://localhost:5173/", screenshotPath: "/tmp/a.png", token: "secret" },
      { type: "variant_plan", plan: { variants: 3 } },
      { type: "checkpoint", revision: 2, phase: "generating", owner: "tab-1", visibleVariant: 1, paramValues: { hue: 10 } },
      { type: "checkpoint", revision: 1, phase: "stale" },
      { type: "variants_ready", sourceFile: "src/Hero.tsx", arrivedVariants: 3 },
      { type: "variant_mount_failed", variant: 2, error: "boom", url: "http://x" },
      { type: "accept", variantId: "2" },
      { type: "agent_done" },
      { type: "mystery" },
    ];
    const entries = events.map((event, i) => ({ seq: i + 1, id: "fx", type: event.type, ts: `2026-01-01T00:00:0${i}.000Z`, event: { ...event, id: "fx" } }));
    fs.writeFileSync(journal("fx"), entries.map((e) => `${JSON.stringify(e)}\n`).join(""));
    const store = open();
    const view = store.getSnapshot("fx")!;
    expect(view.lastSeq).toBe(9);
    expect(view.snapshot).toEqual(fold("fx", entries));
    expect(view.snapshot).toMatchObject({
      phase: "accept_requested",
      expectedVariants: 3,
      visibleVariant: 2,
      browserCheckpointRevision: 2,
      sourceFile: "src/Hero.tsx",
      annotationArtifacts: [{ type: "screenshot", path: "/tmp/a.png" }],
      cancelReason: "accept",
    });
    expect(view.snapshot.diagnostics.map((d) => d.error)).toEqual(["stale_checkpoint_ignored", "late_generation_event_ignored", "unknown_event_type"]);
    expect((view.snapshot.pendingEvent as Record<string, unknown>).token).toBeUndefined();
  });
});
