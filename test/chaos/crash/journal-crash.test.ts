/**
 * Journal crash suite (docs/architecture.md, "Tests and benchmarks"): "nothing acknowledged is ever lost", proved against the
 * real sessions service killed with SIGKILL at random moments.
 *
 * 16 in-process clients (half connect-node gRPC, half @grpc/grpc-js) append keyed events — single
 * events and batches of 2–4 — to 8 sessions while the service, started with `--fsync batch`, is
 * killed at a random moment and restarted on the same state directory, `JOURNAL_ROUNDS` times
 * (default 20). Every third incarnation keeps only 3 sessions open (`--session-cache 3`), so
 * sessions are evicted, their snapshot files written, and re-opened from those files plus the
 * journal's tail while the kills land.
 *
 * After each restart, with the clients quiet, every session is checked through the RPCs and on the
 * disk: every acknowledged append is in the journal exactly once at the seqs it was acknowledged
 * with, with the events that were sent; seqs run 1..N with no gap; every line parses and its
 * checksum matches; no append is there in part; a torn tail the kill left was cut back and
 * reported; GetSnapshot equals a fresh replay of the file by the reducer. Then each client first
 * retries its unacknowledged appends with the same keys: one that had landed must answer
 * `duplicate` with its original seqs, one that had not must be written now. After the last round
 * the clients retry until nothing is unacknowledged, and every append ever sent is in the journal
 * exactly once.
 */
import { existsSync } from "node:fs";
import * as path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { toJson, type JsonObject } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { EntryIntegrity, SessionService, type JournalEntry } from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { createReplay } from "@berth/sessions/reducer";
import { snapshotToProto } from "@berth/sessions/server/snapshot-codec";
import { closeClient, connectClient, grpcJsClient, makeTempDir, startService, stopAll, type GrpcJsClient, type ServiceProcess } from "../../harness.js";
import { CALL_DEADLINE_MS, event, range, withoutRepairNotes, type Sessions } from "./journal-crash-fixtures.js";
import { entryOf, readJournalFile, type JournalFile } from "./journal-files.js";
import { seededRandom } from "../common/seeded-random.js";
import { chaosSetting, reportSuite } from "../common/summary.js";

afterAll(stopAll);

const ROUNDS = chaosSetting("JOURNAL_ROUNDS", 20);
const CLIENTS = chaosSetting("JOURNAL_CLIENTS", 16);
const SESSIONS = chaosSetting("JOURNAL_SESSIONS", 8);
/** The kill lands this long after the clients start (uniformly): from mid-retry to deep in the load. */
const KILL_AFTER_MS: readonly [number, number] = [50, chaosSetting("JOURNAL_MAX_KILL_MS", 3000)];
/** How long the clients may take to notice the kill (their calls fail with the connection). */
const SETTLE_MS = 30_000;
const SEED = chaosSetting("SEED", Math.floor(Math.random() * 2 ** 31));

const random = seededRandom(SEED);
const pick = (n: number): number => Math.floor(random() * n);

function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: nothing after ${ms} ms`)), ms)));
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** A random event; the key is written into it so each event's content is unique to its append. */
function randomEvent(key: string, i: number): Event {
  const tag = `${key}#${i}`;
  switch (pick(4)) {
    case 0:
      return event({ case: "generate", value: { pageUrl: `http://localhost:3000/${tag}`, count: 1 + pick(5) } });
    case 1:
      return event({ case: "variantsReady", value: { arrivedVariants: 1 + pick(5), previewFile: tag } });
    case 2:
      return event({ case: "steer", value: { pageUrl: `/${tag}` } });
    default:
      return event({ case: "agentPhase", value: { phase: tag, durationMs: pick(1000) } });
  }
}

const eventJson = (e: Event | undefined): string => (e === undefined ? "undefined" : JSON.stringify(toJson(EventSchema, e)));

/** One append a client sent: one event (AppendEvent) or several (AppendEvents), with its key. */
interface Append {
  readonly key: string;
  readonly sessionId: string;
  readonly events: readonly Event[];
  readonly batch: boolean;
  attempts: number;
  /** Where the latest check found it (null: not there), since its latest failed attempt. */
  landed: { firstSeq: number; lastSeq: number } | null | undefined;
}

interface Acked {
  readonly sessionId: string;
  readonly firstSeq: number;
  readonly lastSeq: number;
}

/** One life of the service: appends are sent to it until `down` is set, just before the kill. */
interface Incarnation {
  readonly service: ServiceProcess;
  readonly url: string;
  down: boolean;
}

/** What the suite found; violations keep their first messages for the failure report. */
class Findings {
  violations = 0;
  readonly messages: string[] = [];
  violation(message: string): void {
    this.violations++;
    if (this.messages.length < 30) this.messages.push(message);
  }
}

describe("journal crash (SIGKILL under load, restart, check)", () => {
  it(`${ROUNDS} kills: every acknowledged append is in the journal exactly once, retries land exactly once`, async () => {
    const began = performance.now();
    const findings = new Findings();
    const stateDir = path.join(makeTempDir("berth-chaos-journal-"), "state");
    const sessionsDir = path.join(stateDir, "sessions");
    const sessionIds = Array.from({ length: SESSIONS }, (_, i) => `crash-${i}`);
    const sent = new Map<string, Append>();
    const acked = new Map<string, Acked>();
    const figures = {
      acknowledged: 0,
      events: 0,
      batches: 0,
      retries: 0,
      retriesThatHadLanded: 0,
      retriesWrittenAnew: 0,
      unackedButLanded: 0,
      kills: 0,
      tornTailsAfterKill: 0,
      /** Restarts that found a session's snapshot file (so its open could hydrate from it plus the tail). */
      snapshotFilesAtRestart: 0,
      snapshotChecks: 0,
      restartMs: [] as number[],
      checkMs: 0,
    };

    let incarnations = 0;
    const startIncarnation = async (): Promise<Incarnation> => {
      const args = ["--fsync", "batch"];
      // Every third life with a tiny LRU: evictions write snapshot files, re-opens hydrate from them.
      if (incarnations++ % 3 === 2) args.push("--session-cache", "3");
      const started = performance.now();
      const service = await startService("sessions", { stateDir, args });
      figures.restartMs.push(performance.now() - started);
      return { service, url: service.url("sessions"), down: false };
    };

    class Appender {
      readonly pending: Append[] = [];
      private made = 0;
      private connect: { url: string; client: Sessions } | undefined;
      private grpc: { url: string; client: GrpcJsClient } | undefined;
      constructor(readonly index: number) {}

      private newAppend(): Append {
        const key = `c${this.index}-${this.made++}`;
        const batch = random() < 0.25;
        const count = batch ? 2 + pick(3) : 1;
        const append: Append = {
          key,
          sessionId: sessionIds[pick(sessionIds.length)]!,
          events: Array.from({ length: count }, (_, i) => randomEvent(key, i)),
          batch,
          attempts: 0,
          landed: undefined,
        };
        sent.set(key, append);
        return append;
      }

      /** Sends one append to `inc` through this client's library; resolves with its seqs. */
      private async send(inc: Incarnation, a: Append): Promise<{ firstSeq: number; lastSeq: number; duplicate: boolean }> {
        const idempotencyKey = a.key;
        if (this.index % 2 === 0) {
          if (this.connect?.url !== inc.url) {
            if (this.connect) closeClient(this.connect.client);
            this.connect = { url: inc.url, client: connectClient(SessionService, inc.url, { protocol: "grpc", defaultTimeoutMs: CALL_DEADLINE_MS }) };
          }
          const client = this.connect.client;
          if (a.batch) {
            const r = await client.appendEvents({ sessionId: a.sessionId, events: [...a.events], idempotencyKey });
            return { firstSeq: Number(r.firstSeq), lastSeq: Number(r.lastSeq), duplicate: r.duplicate };
          }
          const r = await client.appendEvent({ sessionId: a.sessionId, event: a.events[0]!, idempotencyKey });
          return { firstSeq: Number(r.seq), lastSeq: Number(r.seq), duplicate: r.duplicate };
        }
        if (this.grpc?.url !== inc.url) {
          this.grpc?.client.close();
          this.grpc = { url: inc.url, client: grpcJsClient(inc.url, { deadlineMs: CALL_DEADLINE_MS }) };
        }
        const client = this.grpc.client;
        if (a.batch) {
          const r = await client.unary(SessionService.method.appendEvents, { sessionId: a.sessionId, events: [...a.events], idempotencyKey });
          return { firstSeq: Number(r.firstSeq), lastSeq: Number(r.lastSeq), duplicate: r.duplicate };
        }
        const r = await client.unary(SessionService.method.appendEvent, { sessionId: a.sessionId, event: a.events[0]!, idempotencyKey });
        return { firstSeq: Number(r.seq), lastSeq: Number(r.seq), duplicate: r.duplicate };
      }

      /**
       * Appends until the service goes down (`load`) or until nothing is unacknowledged (`drain`),
       * unacknowledged appends first, each with its original key.
       */
      async run(inc: Incarnation, mode: "load" | "drain"): Promise<void> {
        while (!inc.down) {
          if (mode === "drain" && this.pending.length === 0) return;
          if (this.pending.length === 0) this.pending.push(this.newAppend());
          const a = this.pending[0]!;
          const retry = a.attempts > 0;
          const landed = a.landed;
          a.attempts++;
          a.landed = undefined;
          let result: Awaited<ReturnType<Appender["send"]>>;
          try {
            result = await this.send(inc, a);
          } catch (error) {
            if (!inc.down) {
              findings.violation(`client ${this.index}: append ${a.key} failed while the service was up: ${ConnectError.from(error).message}`);
              await new Promise((resolve) => setTimeout(resolve, 100));
            }
            continue;
          }
          this.pending.shift();
          this.record(a, result, retry, landed);
        }
      }

      private record(a: Append, r: { firstSeq: number; lastSeq: number; duplicate: boolean }, retry: boolean, landed: Append["landed"]): void {
        const where = `client ${this.index}: ${a.key} (${a.sessionId}, ${a.events.length} event(s), attempt ${a.attempts})`;
        if (r.lastSeq - r.firstSeq + 1 !== a.events.length)
          findings.violation(`${where}: acknowledged seqs ${r.firstSeq}..${r.lastSeq} for ${a.events.length} event(s)`);
        if (!retry) {
          if (r.duplicate) findings.violation(`${where}: a first attempt answered duplicate`);
        } else {
          figures.retries++;
          if (landed === undefined) {
            // A retry without a check since the failed attempt (only after an unexpected error): no verdict to compare with.
          } else if (landed === null) {
            figures.retriesWrittenAnew++;
            if (r.duplicate) findings.violation(`${where}: the retry answered duplicate but the key was not in the journal`);
          } else {
            figures.retriesThatHadLanded++;
            if (!r.duplicate) findings.violation(`${where}: the retry wrote again an append that had landed at ${landed.firstSeq}..${landed.lastSeq}`);
            if (r.firstSeq !== landed.firstSeq || r.lastSeq !== landed.lastSeq) {
              findings.violation(`${where}: the retry answered ${r.firstSeq}..${r.lastSeq}, the journal has it at ${landed.firstSeq}..${landed.lastSeq}`);
            }
          }
        }
        acked.set(a.key, { sessionId: a.sessionId, firstSeq: r.firstSeq, lastSeq: r.lastSeq });
        figures.acknowledged++;
        figures.events += a.events.length;
        if (a.batch) figures.batches++;
      }
    }

    const appenders = Array.from({ length: CLIENTS }, (_, i) => new Appender(i));

    /** The journals on the disk right after a kill, before anything opened them again. */
    const tornAfterKill = (): Map<string, JournalFile> => {
      const torn = new Map<string, JournalFile>();
      for (const sessionId of sessionIds) {
        const file = path.join(sessionsDir, `${sessionId}.jsonl`);
        if (!existsSync(file)) continue;
        if (existsSync(path.join(sessionsDir, `${sessionId}.snapshot.json`))) figures.snapshotFilesAtRestart++;
        const read = readJournalFile(file);
        if (read.torn) torn.set(sessionId, read);
      }
      return torn;
    };

    /** Every promise checked against one incarnation with no client traffic. */
    const check = async (inc: Incarnation, label: string, torn: Map<string, JournalFile>): Promise<void> => {
      const started = performance.now();
      const client = connectClient(SessionService, inc.url, { protocol: "grpc", defaultTimeoutMs: CALL_DEADLINE_MS });
      const journalKeys = new Map<string, { sessionId: string; seqs: number[] }>();
      try {
        for (const sessionId of sessionIds) {
          const at = `${label}, ${sessionId}`;
          const file = path.join(sessionsDir, `${sessionId}.jsonl`);
          // GetSnapshot first: it opens the session, which is when a torn tail is cut back.
          const view = await client.getSnapshot({ sessionId }).catch((error: unknown) => {
            if (ConnectError.from(error).code === Code.NotFound) return undefined;
            throw error;
          });
          const ackedHere = [...acked.values()].filter((a) => a.sessionId === sessionId);
          if (view === undefined) {
            if (ackedHere.length > 0) findings.violation(`${at}: no journal, but ${ackedHere.length} append(s) were acknowledged`);
            continue;
          }
          const lastSeq = Number(view.lastSeq);

          // Through the API: ReadJournal from the start.
          const entries: JournalEntry[] = [];
          for await (const batch of client.readJournal({ sessionId })) entries.push(...batch.entries);
          const seqs = entries.map((e) => Number(e.seq));
          if (!seqs.every((seq, i) => seq === i + 1)) findings.violation(`${at}: ReadJournal seqs are not 1..N: ${describeGaps(seqs)}`);
          if (seqs.length !== lastSeq) findings.violation(`${at}: ReadJournal gave ${seqs.length} entries, GetSnapshot says last seq ${lastSeq}`);
          for (const e of entries) {
            if (e.integrity !== EntryIntegrity.VERIFIED) findings.violation(`${at}: entry ${e.seq} integrity ${EntryIntegrity[e.integrity]}`);
            if (e.idempotencyKey === "") {
              findings.violation(`${at}: entry ${e.seq} has no idempotency key (every append of this suite has one)`);
              continue;
            }
            const record = journalKeys.get(e.idempotencyKey) ?? { sessionId, seqs: [] };
            if (record.sessionId !== sessionId) findings.violation(`${at}: key ${e.idempotencyKey} in two sessions`);
            record.seqs.push(Number(e.seq));
            journalKeys.set(e.idempotencyKey, record);
            const a = sent.get(e.idempotencyKey);
            const position = record.seqs.length - 1;
            if (a === undefined) findings.violation(`${at}: entry ${e.seq} has key ${e.idempotencyKey}, which no client sent`);
            else if (eventJson(e.event) !== eventJson(a.events[position])) {
              findings.violation(
                `${at}: entry ${e.seq} (${e.idempotencyKey} #${position}) is ${eventJson(e.event)}, the client sent ${eventJson(a.events[position])}`,
              );
            }
          }

          // On the disk: every line parses and checks, nothing torn is left, the same entries.
          const onDisk = readJournalFile(file);
          for (const bad of onDisk.unparsable) findings.violation(`${at}: line ${bad.line} of the file does not parse: ${bad.problem}`);
          if (onDisk.torn) findings.violation(`${at}: the file still ends with a torn tail after the service opened it (${onDisk.torn.droppedBytes} bytes)`);
          for (const line of onDisk.lines) if (line.checksum !== "valid") findings.violation(`${at}: line ${line.line} checksum ${line.checksum}`);
          const fileSeqs = onDisk.lines.map((l) => l.seq);
          if (!fileSeqs.every((seq, i) => seq === i + 1)) findings.violation(`${at}: file seqs are not 1..N: ${describeGaps(fileSeqs)}`);
          if (fileSeqs.length !== seqs.length) findings.violation(`${at}: the file holds ${fileSeqs.length} entries, ReadJournal ${seqs.length}`);
          onDisk.lines.forEach((line, i) => {
            const viaApi = entries[i];
            if (viaApi && line.key !== viaApi.idempotencyKey)
              findings.violation(`${at}: line ${line.line} key ${line.key}, ReadJournal says ${viaApi.idempotencyKey}`);
          });

          // A torn tail left by the kill: cut back to the whole appends, and reported.
          const before = torn.get(sessionId);
          if (before?.torn) {
            if (onDisk.size < before.torn.keepBytes)
              findings.violation(`${at}: the repair cut into whole entries (${onDisk.size} < ${before.torn.keepBytes} bytes)`);
            const reported = view.snapshot?.diagnostics.some((d) => d.error === "journal_torn_tail_repaired");
            if (!reported) findings.violation(`${at}: a torn tail was cut back without a journal_torn_tail_repaired diagnostic`);
            const logged = inc.service
              .entries()
              .some((entry) => entry.sessionId === sessionId && typeof entry.msg === "string" && entry.msg.includes("torn write"));
            if (!logged) findings.violation(`${at}: a torn tail was cut back without a log line`);
          }

          // The snapshot equals a fresh replay of the file by the reducer.
          const replay = createReplay(sessionId);
          for (const line of onDisk.lines) replay.apply(entryOf(line));
          const replayed = toJson(SnapshotSchema, snapshotToProto(replay.snapshot())) as JsonObject;
          const served = withoutRepairNotes(view.snapshot);
          figures.snapshotChecks++;
          if (!isDeepStrictEqual(served, replayed)) {
            findings.violation(
              `${at}: GetSnapshot differs from a replay of the journal:\n  served   ${JSON.stringify(served)}\n  replayed ${JSON.stringify(replayed)}`,
            );
          }
        }
      } finally {
        closeClient(client);
      }

      // Acknowledged appends: each exactly once, where it was acknowledged; others whole or absent.
      for (const [key, ack] of acked) {
        const found = journalKeys.get(key);
        const expected = range(ack.firstSeq, ack.lastSeq);
        if (!found) findings.violation(`${label}: acknowledged ${key} (${ack.sessionId} ${ack.firstSeq}..${ack.lastSeq}) is not in the journal`);
        else if (found.sessionId !== ack.sessionId || !isDeepStrictEqual(found.seqs, expected)) {
          findings.violation(
            `${label}: acknowledged ${key} at ${ack.sessionId} ${ack.firstSeq}..${ack.lastSeq}, the journal has it at ${found.sessionId} ${found.seqs.join(",")}`,
          );
        }
      }
      for (const [key, found] of journalKeys) {
        const a = sent.get(key);
        if (a && found.seqs.length !== a.events.length)
          findings.violation(`${label}: ${key} has ${found.seqs.length} of its ${a.events.length} entries in the journal`);
        if (a && !isDeepStrictEqual(found.seqs, range(found.seqs[0]!, found.seqs[0]! + found.seqs.length - 1))) {
          findings.violation(`${label}: ${key}'s entries are not consecutive: ${found.seqs.join(",")}`);
        }
      }
      for (const appender of appenders) {
        for (const a of appender.pending) {
          const found = journalKeys.get(a.key);
          a.landed = found ? { firstSeq: found.seqs[0]!, lastSeq: found.seqs[found.seqs.length - 1]! } : null;
          if (found) figures.unackedButLanded++;
        }
      }
      figures.checkMs += performance.now() - started;
    };

    let inc = await startIncarnation();
    for (let round = 1; round <= ROUNDS; round++) {
      const runs = appenders.map((appender) => appender.run(inc, "load"));
      const killAfter = KILL_AFTER_MS[0] + random() * (KILL_AFTER_MS[1] - KILL_AFTER_MS[0]);
      await new Promise((resolve) => setTimeout(resolve, killAfter));
      inc.down = true;
      const status = await inc.service.kill();
      figures.kills++;
      if (status.signal !== "SIGKILL") findings.violation(`round ${round}: the service ended by ${JSON.stringify(status)} before the kill`);
      await withTimeout(Promise.all(runs), SETTLE_MS, `round ${round}: the clients did not all notice the kill`);
      const torn = tornAfterKill();
      figures.tornTailsAfterKill += torn.size;
      inc = await startIncarnation();
      await check(inc, `round ${round}`, torn);
      if (findings.violations > 0) break;
    }

    // The last life: no kill. Every client retries what is still unacknowledged until it is.
    const unacked = appenders.reduce((n, a) => n + a.pending.length, 0);
    await withTimeout(Promise.all(appenders.map((appender) => appender.run(inc, "drain"))), 60_000, "the final retries");
    await check(inc, "final", new Map());
    for (const a of sent.values()) if (!acked.has(a.key)) findings.violation(`final: ${a.key} was never acknowledged`);
    expect(await inc.service.stop()).toEqual({ code: 0, signal: null });

    const seconds = Math.round((performance.now() - began) / 100) / 10;
    const restarts = [...figures.restartMs].sort((a, b) => a - b);
    reportSuite({
      suite: "journal-crash",
      rounds: figures.kills,
      operations: figures.acknowledged,
      violations: findings.violations,
      events: figures.events,
      batches: figures.batches,
      clients: CLIENTS,
      sessions: SESSIONS,
      kills: figures.kills,
      retries: figures.retries,
      retriesThatHadLanded: figures.retriesThatHadLanded,
      retriesWrittenAnew: figures.retriesWrittenAnew,
      unackedAtTheEnd: unacked,
      tornTailsAfterKill: figures.tornTailsAfterKill,
      snapshotFilesAtRestart: figures.snapshotFilesAtRestart,
      snapshotChecks: figures.snapshotChecks,
      restartMsP50: Math.round(restarts[Math.floor(restarts.length / 2)] ?? 0),
      checkSeconds: Math.round(figures.checkMs / 100) / 10,
      seconds,
      seed: SEED,
    });
    expect(findings.messages, `seed ${SEED}`).toEqual([]);
    expect(findings.violations).toBe(0);
  });
});

/** Where a seq list departs from 1..N, briefly. */
function describeGaps(seqs: readonly unknown[]): string {
  const i = seqs.findIndex((seq, index) => seq !== index + 1);
  return `${seqs.length} entries; position ${i + 1} holds ${String(seqs[i])} (around: ${seqs.slice(Math.max(0, i - 2), i + 3).join(",")})`;
}
