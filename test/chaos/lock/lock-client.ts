/**
 * One client process of the lock chaos suite (`lock-chaos.test.ts`), spawned as
 * `node test/dist/chaos/lock-client.js '<LockClientConfig JSON>'`.
 *
 * Forever, until killed or until its stdin closes (the suite went away): pick one of the files,
 * take its lock — with a Hold stream or with Acquire + KeepAlive (unary calls, or a KeepAliveStream)
 * + Release — and, while holding
 * it, make a few protected writes: `AppendEvent`s to the file's session fenced with the grant's
 * fencing token. Everything it does goes to its log (see `lock-records.ts`) before and after it
 * happens, so the suite can tell what was attempted, what was acknowledged and what was refused.
 *
 * The client is deliberately naive about losing its lock: it does not look at KeepAlive answers
 * before writing. A holder that was paused past its lease must be stopped by the fence alone.
 */
import { randomUUID } from "node:crypto";
import { openSync, writeSync } from "node:fs";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { FenceRejectedSchema, SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { sessionOfFile, WRITE_EVENT_TYPE, type LockClientConfig, type LockMode, type LockRecord } from "./lock-records.js";

/** How long a turn waits in the queue; far longer than any holder keeps a lock. */
const WAIT_MS = 60_000;
/** Bound of every unary call, so a lost answer cannot hang the client. */
const CALL_TIMEOUT_MS = 20_000;

const config = JSON.parse(process.argv[2] ?? "") as LockClientConfig;
const log = openSync(config.logPath, "a");
const transport = createGrpcTransport({ baseUrl: config.url });
const locks = createClient(LockService, transport);
const sessions = createClient(SessionService, transport);
const owner = `chaos-${config.client}-${process.pid}`;

// The suite going away (its end of stdin closes) ends this process: no orphan keeps taking locks.
process.stdin.on("end", () => process.exit(0));
process.stdin.on("close", () => process.exit(0));
process.stdin.resume();

type Fields<E extends LockRecord["event"]> = Omit<Extract<LockRecord, { event: E }>, "client" | "pid" | "t" | "event">;

/** Appends a record to the log (one write: whole or not at all) and, when asked, to stdout. */
function record<E extends LockRecord["event"]>(event: E, fields: Fields<E>, announce = false): void {
  const line = `${JSON.stringify({ event, client: config.client, pid: process.pid, t: performance.timeOrigin + performance.now(), ...fields })}\n`;
  writeSync(log, line);
  if (announce) process.stdout.write(line);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function randomInt(min: number, max: number): number {
  return min + Math.floor(Math.random() * (max - min + 1));
}

/** A request stream fed by `push` (KeepAlive's renewals). */
function requestQueue<T>() {
  const items: T[] = [];
  let ended = false;
  let wake: (() => void) | undefined;
  async function* requests(): AsyncGenerator<T> {
    for (;;) {
      const item = items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (ended) return;
      await new Promise<void>((resolve) => (wake = resolve));
      wake = undefined;
    }
  }
  return {
    requests: requests(),
    push(item: T) {
      items.push(item);
      wake?.();
    },
    end() {
      ended = true;
      wake?.();
    },
  };
}

/**
 * The protected writes of one grant. Stops at the first refusal: a refused fence means the lock is
 * gone, and a holder that knows it has lost its lock must not go on.
 */
async function protectedWrites(file: string, fencingToken: number, mode: LockMode): Promise<boolean> {
  const plan = config[mode];
  const count = randomInt(plan.writesMin, plan.writesMax);
  const pauseMax = plan.pauseMaxMs;
  const sessionId = sessionOfFile(config, file);
  for (let n = 1; n <= count; n++) {
    if (n > 1 && pauseMax > 0) await sleep(randomInt(0, pauseMax));
    record("write-attempt", { file, fencingToken, n });
    try {
      const fields = { file, fencingToken, client: config.client, pid: process.pid, n };
      const answer = await sessions.appendEvent(
        { sessionId, event: { kind: { case: "other", value: { type: WRITE_EVENT_TYPE, fields } } }, fence: { file, fencingToken: BigInt(fencingToken) } },
        { timeoutMs: CALL_TIMEOUT_MS },
      );
      record("write-ok", { file, fencingToken, n, seq: Number(answer.seq) });
    } catch (error) {
      const failure = ConnectError.from(error);
      const detail = failure.findDetails(FenceRejectedSchema)[0];
      if (failure.code === Code.FailedPrecondition && detail !== undefined) {
        const refusal = { file: detail.file, fencingToken: Number(detail.fencingToken), currentToken: Number(detail.currentToken) };
        record("write-refused", { file, fencingToken, n, code: Code[failure.code], detail: refusal });
      } else {
        record("write-error", { file, fencingToken, n, code: Code[failure.code], message: failure.rawMessage });
      }
      return false;
    }
  }
  return true;
}

/** One turn with a Hold stream: held until this client ends the stream. */
async function holdTurn(file: string): Promise<void> {
  const end = new AbortController();
  record("asked", { file, mode: "hold" }, true);
  const stream = locks.hold({ file, owner, maxWait: durationFromMs(WAIT_MS) }, { signal: end.signal })[Symbol.asyncIterator]();
  let fencingToken: number | undefined;
  try {
    while (fencingToken === undefined) {
      const next = await stream.next();
      if (next.done) throw new Error("the hold stream ended before the lock was granted");
      if (next.value.kind.case === "acquired") fencingToken = Number(next.value.kind.value.fencingToken);
    }
  } catch (error) {
    end.abort();
    throw error;
  }
  record("granted", { file, mode: "hold", fencingToken, ttlMs: null }, true);
  // Heartbeats read in the background until the stream ends.
  const drained = (async () => {
    try {
      while (!(await stream.next()).done);
    } catch {
      // Ended by our own abort, or by the service: the writes' fences tell which.
    }
  })();
  const kept = await protectedWrites(file, fencingToken, "hold");
  record("releasing", { file, fencingToken });
  end.abort();
  await drained;
  record("released", { file, fencingToken, lost: !kept, released: null }, true);
}

/**
 * Renews `leaseToken` every quarter of its ttl until stopped: on one KeepAliveStream, or with unary
 * KeepAlive calls (each bounded; a lost answer is just a renewal that did not happen).
 */
function keepRenewing(leaseToken: string, overStream: boolean): () => Promise<void> {
  const every = Math.max(1, Math.floor(config.leaseTtlMs / 4));
  if (!overStream) {
    const renew = () => void locks.keepAlive({ leaseTokens: [leaseToken] }, { timeoutMs: CALL_TIMEOUT_MS }).catch(() => {});
    renew();
    const timer = setInterval(renew, every);
    return async () => clearInterval(timer);
  }
  const renewals = requestQueue<{ leaseToken: string }>();
  const stopRenewing = new AbortController();
  const answers = (async () => {
    try {
      for await (const _ of locks.keepAliveStream(renewals.requests, { signal: stopRenewing.signal }));
    } catch {
      // Ended by our abort below; a lease that was lost shows in the writes' fences.
    }
  })();
  const renew = () => renewals.push({ leaseToken });
  renew();
  const timer = setInterval(renew, every);
  return async () => {
    clearInterval(timer);
    renewals.end();
    stopRenewing.abort();
    await answers;
  };
}

/** One turn with Acquire + KeepAlive + Release on a short lease. */
async function leaseTurn(file: string): Promise<void> {
  record("asked", { file, mode: "lease" }, true);
  // Every Acquire carries a request id: a retry of it would answer the same lease, never a second one.
  const { lease } = await locks.acquire(
    { file, owner, maxWait: durationFromMs(WAIT_MS), ttl: durationFromMs(config.leaseTtlMs), requestId: randomUUID() },
    { timeoutMs: WAIT_MS + CALL_TIMEOUT_MS },
  );
  if (lease === undefined) throw new Error("Acquire answered without a lease");
  const fencingToken = Number(lease.fencingToken);
  const leaseToken = lease.leaseToken;
  record("granted", { file, mode: "lease", fencingToken, ttlMs: config.leaseTtlMs }, true);

  const stopRenewing = keepRenewing(leaseToken, Math.random() < 0.5);
  let kept: boolean;
  try {
    kept = await protectedWrites(file, fencingToken, "lease");
  } finally {
    await stopRenewing();
  }
  record("releasing", { file, fencingToken });
  const { released } = await locks.release({ leaseToken }, { timeoutMs: CALL_TIMEOUT_MS });
  record("released", { file, fencingToken, lost: !kept, released }, true);
}

for (;;) {
  const file = config.files[randomInt(0, config.files.length - 1)]!;
  const mode: LockMode = Math.random() < config.holdShare ? "hold" : "lease";
  try {
    await (mode === "hold" ? holdTurn(file) : leaseTurn(file));
  } catch (error) {
    const failure = ConnectError.from(error);
    record("turn-error", { file, mode, code: Code[failure.code], message: failure.rawMessage }, true);
    await sleep(50);
  }
}
