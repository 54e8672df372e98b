/**
 * Journals damaged on the disk, opened by the real sessions service as the reader promises
 * (docs/architecture.md, "Tests and benchmarks"): a journal with a torn last line (and one with
 * half an append of several events) cut back to the last whole entry and reported, and journals
 * with a damaged middle line, the line skipped and reported, the rest served.
 */
import { appendFileSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { toJson, type JsonObject } from "@bufbuild/protobuf";
import { afterAll, describe, expect, it } from "vitest";
import type { Event } from "@berth/api/berth/sessions/v1/events_pb";
import { SessionService, type JournalEntry } from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { createReplay } from "@berth/sessions/reducer";
import { encodeJournalLine } from "@berth/sessions/journal/journal-format";
import { snapshotToProto } from "@berth/sessions/server/snapshot-codec";
import { closeClient, connectClient, makeTempDir, startService, stopAll } from "../../harness.js";
import { CALL_DEADLINE_MS, event, range, withoutRepairNotes, type Sessions } from "./journal-crash-fixtures.js";
import { entryOf, readJournalFile } from "./journal-files.js";

afterAll(stopAll);

describe("journals damaged on the disk open as the reader promises", () => {
  const sessionsOf = (url: string): Sessions => connectClient(SessionService, url, { protocol: "grpc", defaultTimeoutMs: CALL_DEADLINE_MS });
  const phase = (name: string): Event => event({ case: "agentPhase", value: { phase: name } });
  const generate = (count: number): Event => event({ case: "generate", value: { pageUrl: "http://localhost:3000/", count } });

  async function readAll(client: Sessions, sessionId: string): Promise<JournalEntry[]> {
    const entries: JournalEntry[] = [];
    for await (const batch of client.readJournal({ sessionId })) entries.push(...batch.entries);
    return entries;
  }

  /** The reducer's replay of the file's whole, readable lines (what the snapshot must equal, repair notes aside). */
  function replayOf(file: string, sessionId: string): JsonObject {
    const replay = createReplay(sessionId);
    for (const line of readJournalFile(file).lines) if (line.checksum !== "mismatch") replay.apply(entryOf(line));
    return toJson(SnapshotSchema, snapshotToProto(replay.snapshot())) as JsonObject;
  }

  const diagnosticsOf = (snapshot: Snapshot | undefined) => (snapshot?.diagnostics ?? []).map((d) => ({ error: d.error, ...(d.fields ?? {}) }));

  it("a torn last line, and half an append of several events, are cut back to the last whole entry and reported", async () => {
    const stateDir = path.join(makeTempDir("berth-chaos-torn-"), "state");
    const first = await startService("sessions", { stateDir, args: ["--fsync", "batch"] });
    let client = sessionsOf(first.url("sessions"));
    for (const sessionId of ["torn-line", "torn-batch"]) {
      await client.appendEvent({ sessionId, event: generate(3), idempotencyKey: `${sessionId}-1` });
      await client.appendEvents({ sessionId, events: [phase("a"), phase("b"), phase("c")], idempotencyKey: `${sessionId}-2` });
      await client.appendEvent({ sessionId, event: phase("d"), idempotencyKey: `${sessionId}-3` });
    }
    closeClient(client);
    // A clean stop writes the snapshot files: the torn bytes must be found past their fence too.
    expect(await first.stop()).toEqual({ code: 0, signal: null });

    const dir = path.join(stateDir, "sessions");
    const lineFile = path.join(dir, "torn-line.jsonl");
    const batchFile = path.join(dir, "torn-batch.jsonl");
    const lineBefore = readFileSync(lineFile);
    const batchBefore = readFileSync(batchFile);
    const ts = new Date().toISOString();
    // A crash in the middle of writing one line: its first 40 bytes, no newline.
    const lost = encodeJournalLine(
      { seq: 6, id: "torn-line", type: "agent_phase", ts, event: { type: "agent_phase", id: "torn-line", phase: "lost" } },
      { ikey: "torn-line-lost" },
    );
    appendFileSync(lineFile, lost.slice(0, 40));
    // A crash after two of the three lines of an AppendEvents: whole lines, but half an append.
    const lostBatch = [
      encodeJournalLine(
        { seq: 6, id: "torn-batch", type: "agent_phase", ts, event: { type: "agent_phase", id: "torn-batch", phase: "x" } },
        { ikey: "torn-batch-lost", n: 3 },
      ),
      encodeJournalLine({ seq: 7, id: "torn-batch", type: "agent_phase", ts, event: { type: "agent_phase", id: "torn-batch", phase: "y" } }),
    ];
    appendFileSync(batchFile, lostBatch.join(""));
    expect(readJournalFile(lineFile).torn).toMatchObject({ keepBytes: lineBefore.length });
    expect(readJournalFile(batchFile).torn).toMatchObject({ keepBytes: batchBefore.length, droppedLines: 2 });

    const second = await startService("sessions", { stateDir, args: ["--fsync", "batch"] });
    client = sessionsOf(second.url("sessions"));
    const cases = [
      { sessionId: "torn-line", file: lineFile, before: lineBefore, bytesDropped: 40, entriesDropped: 0 },
      { sessionId: "torn-batch", file: batchFile, before: batchBefore, bytesDropped: Buffer.byteLength(lostBatch.join("")), entriesDropped: 2 },
    ];
    for (const c of cases) {
      const view = await client.getSnapshot({ sessionId: c.sessionId });
      expect(view.lastSeq, c.sessionId).toBe(5n);
      // Cut back to exactly the bytes of the whole entries, and said so in the snapshot and the log.
      expect(readFileSync(c.file).equals(c.before), c.sessionId).toBe(true);
      expect(diagnosticsOf(view.snapshot), c.sessionId).toContainEqual(
        expect.objectContaining({ error: "journal_torn_tail_repaired", bytesDropped: c.bytesDropped, entriesDropped: c.entriesDropped }),
      );
      const warned = await second.waitForLog((entry) => entry.sessionId === c.sessionId && String(entry.msg).includes("torn write"), 5_000);
      expect(warned, c.sessionId).toMatchObject({ bytesDropped: c.bytesDropped, entriesDropped: c.entriesDropped });
      expect(
        (await readAll(client, c.sessionId)).map((e) => Number(e.seq)),
        c.sessionId,
      ).toEqual([1, 2, 3, 4, 5]);
      expect(withoutRepairNotes(view.snapshot), c.sessionId).toEqual(replayOf(c.file, c.sessionId));
    }
    // What was torn off was never acknowledged: a retry with its key is written now, once.
    const lineRetry = await client.appendEvent({ sessionId: "torn-line", event: phase("lost"), idempotencyKey: "torn-line-lost" });
    expect(lineRetry).toMatchObject({ seq: 6n, duplicate: false });
    const batchRetry = await client.appendEvents({ sessionId: "torn-batch", events: [phase("x"), phase("y"), phase("z")], idempotencyKey: "torn-batch-lost" });
    expect(batchRetry).toMatchObject({ firstSeq: 6n, lastSeq: 8n, duplicate: false });
    closeClient(client);
    await second.kill();

    // And once more after a crash: the retries are in the journal once; a second retry is a duplicate.
    const third = await startService("sessions", { stateDir, args: ["--fsync", "batch"] });
    client = sessionsOf(third.url("sessions"));
    expect(
      await client.appendEvents({ sessionId: "torn-batch", events: [phase("x"), phase("y"), phase("z")], idempotencyKey: "torn-batch-lost" }),
    ).toMatchObject({ firstSeq: 6n, lastSeq: 8n, duplicate: true });
    for (const c of cases) {
      const onDisk = readJournalFile(c.file);
      expect(onDisk.torn, c.sessionId).toBeUndefined();
      expect(onDisk.unparsable, c.sessionId).toEqual([]);
      expect(
        onDisk.lines.every((line) => line.checksum === "valid"),
        c.sessionId,
      ).toBe(true);
      expect(
        onDisk.lines.map((line) => line.seq),
        c.sessionId,
      ).toEqual(range(1, c.sessionId === "torn-line" ? 6 : 8));
    }
    closeClient(client);
    expect(await third.stop()).toEqual({ code: 0, signal: null });
  });

  it("a damaged middle line stays: unparsable → journal_parse_failed, parses but altered → journal_checksum_mismatch; the rest is served", async () => {
    const stateDir = path.join(makeTempDir("berth-chaos-damaged-"), "state");
    const first = await startService("sessions", { stateDir, args: ["--fsync", "batch"] });
    let client = sessionsOf(first.url("sessions"));
    const sessions = ["damaged-json", "damaged-crc"];
    for (const sessionId of sessions) {
      await client.appendEvent({ sessionId, event: generate(2) });
      await client.appendEvent({ sessionId, event: phase("planning") });
      await client.appendEvent({ sessionId, event: generate(3) }); // line 3, the one damaged below
      await client.appendEvent({ sessionId, event: phase("writing") });
      await client.appendEvent({ sessionId, event: phase("checking") });
    }
    closeClient(client);
    await first.kill();
    const dir = path.join(stateDir, "sessions");
    for (const sessionId of sessions) {
      // A snapshot file whose fence still matches would be served without reading the journal
      // (the seed's rule); the promise under test is what a replay of the damaged journal gives.
      for (const name of readdirSync(dir)) if (name.startsWith(`${sessionId}.snapshot`)) rmSync(path.join(dir, name));
    }

    const damage = (sessionId: string, change: (line: string) => string): Buffer => {
      const file = path.join(dir, `${sessionId}.jsonl`);
      const lines = readFileSync(file, "utf8").split("\n");
      const changed = change(lines[2]!);
      expect(changed).not.toBe(lines[2]);
      lines[2] = changed;
      writeFileSync(file, lines.join("\n"));
      return readFileSync(file);
    };
    // Not JSON any more (a disk that returned garbage, an editor that mangled it).
    const jsonBytes = damage("damaged-json", (line) => `#${line.slice(1)}`);
    // Still JSON, one digit changed: only the checksum can tell.
    const crcBytes = damage("damaged-crc", (line) => line.replace('"count":3', '"count":9'));

    const second = await startService("sessions", { stateDir, args: ["--fsync", "batch"] });
    client = sessionsOf(second.url("sessions"));
    for (const [sessionId, bytes, error] of [
      ["damaged-json", jsonBytes, "journal_parse_failed"],
      ["damaged-crc", crcBytes, "journal_checksum_mismatch"],
    ] as const) {
      const file = path.join(dir, `${sessionId}.jsonl`);
      const view = await client.getSnapshot({ sessionId });
      expect(view.lastSeq, sessionId).toBe(5n);
      const diagnostics = diagnosticsOf(view.snapshot);
      expect(diagnostics, sessionId).toContainEqual(expect.objectContaining({ error, line: 3 }));
      expect(
        diagnostics.filter((d) => d.error.startsWith("journal_")),
        sessionId,
      ).toHaveLength(1);
      // The damaged entry is not applied: the session is what the other four entries make it.
      expect(view.snapshot?.expectedVariants, sessionId).toBe(2);
      const { diagnostics: _served, diagnosticsTotal: _servedTotal, ...served } = toJson(SnapshotSchema, view.snapshot!) as JsonObject;
      const { diagnostics: _replayed, diagnosticsTotal: _replayedTotal, ...replayed } = replayOf(file, sessionId);
      expect(served, sessionId).toEqual(replayed);
      // A middle line is never cut or rewritten: the file is as the damage left it.
      expect(readFileSync(file).equals(bytes), sessionId).toBe(true);
      expect(
        (await readAll(client, sessionId)).map((e) => Number(e.seq)),
        sessionId,
      ).toEqual([1, 2, 4, 5]);
      // Appends go on after the highest seq.
      expect((await client.appendEvent({ sessionId, event: phase("after") })).seq, sessionId).toBe(6n);
      expect(
        (await readAll(client, sessionId)).map((e) => Number(e.seq)),
        sessionId,
      ).toEqual([1, 2, 4, 5, 6]);
      const after = await client.getSnapshot({ sessionId });
      expect(diagnosticsOf(after.snapshot), sessionId).toContainEqual(expect.objectContaining({ error, line: 3 }));
      expect(after.snapshot?.generationPhase, sessionId).toBe("after");
    }
    closeClient(client);
    expect(await second.stop()).toEqual({ code: 0, signal: null });
  });
});
