/**
 * Memory that stays bounded (`npm run bench -- sessions --only=memory`): the resident memory of a
 * sessions service (from /proc) under the loads that could grow it without end, each a figure
 * with the RSS at start, its peak and at the end, and the bound it must stay within:
 *
 * - 10,000 sessions touched in turn with the default cache (1,000 open sessions): one append each,
 *   then a read of each; the cache, not the number of sessions, bounds what is kept;
 * - one session with 1,000,000 idempotency keys (a journal written in berth's format, opened by the
 *   service, then a keyed append and a retry): every key is kept, and the open reads the whole
 *   journal at once, so the peak is about twice the journal's size on top;
 * - 10,000 seed lock files in the live directory (held by a live process, a tenth of them
 *   unreadable), each refused to a try-once Acquire, plus 1,000 grants of other files.
 */
import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import { encodeJournalLine } from "@berth/sessions/journal/journal-format";
import { lockFilePath } from "@berth/sessions/locks/lock-file-protocol";
import { grpcServiceClient, target, unary } from "../../lib/grpc-clients.js";
import { emit } from "../../lib/report.js";
import { startBenchServer, type BenchServer } from "../../lib/server.js";

const SessionService = grpcServiceClient("berth/sessions/v1/session_service.proto", "berth.sessions.v1.SessionService");
const LockService = grpcServiceClient("berth/locks/v1/lock_service.proto", "berth.locks.v1.LockService");

const MB = 1024 * 1024;
const mb = (bytes: number) => Math.round((bytes / MB) * 10) / 10;

/** The bounds the README states: a figure over its bound fails the bench. */
export const MEMORY_BOUNDS_MB = { sessions10k: 150, keys1m: 700, lockFiles10k: 150 } as const;

/** Samples the server's RSS while `work` runs: at start, the peak (every 50 ms), at the end. */
async function rssDuring<T>(server: BenchServer, work: () => Promise<T>): Promise<{ result: T; startMb: number; peakMb: number; endMb: number }> {
  const start = server.rssBytes();
  let peak = start;
  const timer = setInterval(() => (peak = Math.max(peak, server.rssBytes())), 50);
  try {
    const result = await work();
    const end = server.rssBytes();
    return { result, startMb: mb(start), peakMb: mb(Math.max(peak, end)), endMb: mb(end) };
  } finally {
    clearInterval(timer);
  }
}

/** Runs `task(i)` for i in [0, count) with `concurrency` in flight. */
async function inTurn(count: number, concurrency: number, task: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) await task(next++);
    }),
  );
}

function checkBound(figure: string, peakMb: number, boundMb: number): void {
  if (peakMb > boundMb) {
    process.stderr.write(`memory: ${figure}: peak RSS ${peakMb} MB is over its bound of ${boundMb} MB\n`);
    process.exitCode = 1;
  }
}

const checkpoint = (reason: string) => ({ checkpoint: { reason } });

async function manySessions(): Promise<void> {
  const count = 10_000;
  const server = await startBenchServer("sessions");
  const client = new SessionService(target(server.url), grpc.credentials.createInsecure());
  try {
    await unary(client, "appendEvent", { sessionId: "warm", event: checkpoint("warm") });
    const { startMb, peakMb, endMb } = await rssDuring(server, async () => {
      await inTurn(count, 16, (i) => unary(client, "appendEvent", { sessionId: `s${i}`, event: checkpoint(`touch ${i}`) }));
      await inTurn(count, 16, (i) => unary(client, "getSnapshot", { sessionId: `s${i}` }));
    });
    emit({
      figure: "memory: 10,000 sessions touched in turn, default cache (1,000)",
      sessions: count,
      rss_start_mb: startMb,
      rss_peak_mb: peakMb,
      rss_end_mb: endMb,
      bound_mb: MEMORY_BOUNDS_MB.sessions10k,
    });
    checkBound("10,000 sessions", peakMb, MEMORY_BOUNDS_MB.sessions10k);
  } finally {
    client.close();
    await server.stop();
  }
}

/** Writes the journal of `id` with `count` keyed entries in berth's own format (what `count` keyed appends leave). */
function writeKeyedJournal(dir: string, id: string, count: number): void {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const fd = fs.openSync(path.join(dir, `${id}.jsonl`), "w", 0o600);
  try {
    const ts = new Date().toISOString();
    let chunk: string[] = [];
    for (let seq = 1; seq <= count; seq++) {
      chunk.push(
        encodeJournalLine(
          { seq, id, type: "checkpoint", ts, event: { type: "checkpoint", id, revision: seq } },
          { ikey: `key-${seq.toString(36)}-${(seq * 2654435761) % 4294967296}` },
        ),
      );
      if (chunk.length === 10_000) {
        fs.writeSync(fd, chunk.join(""));
        chunk = [];
      }
    }
    if (chunk.length > 0) fs.writeSync(fd, chunk.join(""));
  } finally {
    fs.closeSync(fd);
  }
}

async function manyKeys(): Promise<void> {
  const count = 1_000_000;
  const server = await startBenchServer("sessions");
  const client = new SessionService(target(server.url), grpc.credentials.createInsecure());
  try {
    writeKeyedJournal(path.join(server.stateDir, "sessions"), "keyed", count);
    const { result, startMb, peakMb, endMb } = await rssDuring(server, async () => {
      const opened = performance.now();
      await unary(client, "getSnapshot", { sessionId: "keyed" });
      const openMs = performance.now() - opened;
      // A new keyed append, then its retry: both look the key up among the million.
      await unary(client, "appendEvent", { sessionId: "keyed", idempotencyKey: "new", event: checkpoint("new") });
      const retry = await unary<{ seq: number }>(client, "appendEvent", { sessionId: "keyed", idempotencyKey: "new", event: checkpoint("new") });
      return { openMs, seq: retry.seq };
    });
    if (result.seq !== count + 1) throw new Error(`the retried append answered seq ${result.seq}, not ${count + 1}`);
    emit({
      figure: "memory: one session with 1,000,000 idempotency keys",
      keys: count,
      open_ms: Math.round(result.openMs),
      rss_start_mb: startMb,
      rss_peak_mb: peakMb,
      rss_end_mb: endMb,
      rss_per_key_bytes: Math.round(((endMb - startMb) * MB) / count),
      bound_mb: MEMORY_BOUNDS_MB.keys1m,
    });
    checkBound("1,000,000 keys", peakMb, MEMORY_BOUNDS_MB.keys1m);
  } finally {
    client.close();
    await server.stop();
  }
}

async function manyLockFiles(): Promise<void> {
  const count = 10_000;
  const live = fs.mkdtempSync(path.join(tmpdir(), "berth-bench-live-"));
  const project = fs.mkdtempSync(path.join(tmpdir(), "berth-bench-project-"));
  const locksDir = path.join(live, "locks");
  fs.mkdirSync(locksDir, { recursive: true });
  const file = (i: number) => path.join(project, "src", `file-${i}.ts`);
  for (let i = 0; i < count; i++) {
    // Held by this (live) process, as a seed process's would be; every tenth unreadable (a writer between create and write).
    const content = i % 10 === 0 ? "" : `${JSON.stringify({ owner: `seed-${i}`, token: `t${i}`, pid: process.pid, at: Date.now(), file: file(i) })}\n`;
    fs.writeFileSync(lockFilePath(locksDir, file(i)), content);
  }
  const server = await startBenchServer("sessions", [`--live-dir=${live}`]);
  const client = new LockService(target(server.url), grpc.credentials.createInsecure());
  try {
    const { result, startMb, peakMb, endMb } = await rssDuring(server, async () => {
      let refused = 0;
      await inTurn(count, 16, async (i) => {
        try {
          // max_wait zero: try once (unset would wait the longest wait).
          await unary(client, "acquire", { file: file(i), owner: "bench", maxWait: { seconds: 0 } });
        } catch {
          refused++;
        }
      });
      await inTurn(1000, 16, async (i) => {
        const granted = await unary<{ lease: { leaseToken: string } }>(client, "acquire", { file: path.join(project, "free", `${i}.ts`), owner: "bench" });
        await unary(client, "release", { leaseToken: granted.lease.leaseToken });
      });
      return refused;
    });
    if (result !== count) throw new Error(`${result} of the ${count} seed-held files were refused, not all`);
    emit({
      figure: "memory: 10,000 seed lock files in the live directory",
      lock_files: count,
      refused: result,
      grants: 1000,
      rss_start_mb: startMb,
      rss_peak_mb: peakMb,
      rss_end_mb: endMb,
      bound_mb: MEMORY_BOUNDS_MB.lockFiles10k,
    });
    checkBound("10,000 lock files", peakMb, MEMORY_BOUNDS_MB.lockFiles10k);
  } finally {
    client.close();
    await server.stop();
    fs.rmSync(live, { recursive: true, force: true });
    fs.rmSync(project, { recursive: true, force: true });
  }
}

/** The memory figures; see the module comment. */
export async function memoryBounds(): Promise<void> {
  await manySessions();
  await manyKeys();
  await manyLockFiles();
}
