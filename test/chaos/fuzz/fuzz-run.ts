/**
 * One fuzzing campaign against one service process: cases drawn in seeded batches (fast-check),
 * sent with bounded concurrency, each answer judged, and after every batch the process checked —
 * alive, health SERVING over both protocols, nothing written outside its state directory, and no
 * journal (or running-tally) change that an acknowledged call does not explain.
 */
import { fromBinary, fromJsonString, toJson, type DescMessage, type DescMethod, type DescService, type JsonValue } from "@bufbuild/protobuf";
import fc from "fast-check";
import * as path from "node:path";
import { HealthCheckRequestSchema, HealthCheckResponseSchema } from "@berth/api/grpc/health/v1/health_pb";
import { toBinary, create } from "@bufbuild/protobuf";
import { caseArbitrary, type FuzzCase } from "./fuzz-cases.js";
import type { InputSettings } from "./fuzz-messages.js";
import { buildRequest, type BuiltRequest, type TokenPools } from "./fuzz-requests.js";
import { journalChange, journalDigests, runningIds, diffTrees, snapshotTree, type FuzzTarget, type JournalDigest } from "./fuzz-target.js";
import { Http1Client, Http2Lane, rawSocketCall } from "./fuzz-clients.js";
import { CODE_NAMES, envelope, requestBytes, type Answer } from "./fuzz-framing.js";
import { healthCheckOnce } from "../../harness/processes.js";

/** A broken promise, with what it takes to send the same request again. */
export interface Violation {
  readonly kind: string;
  readonly caseId: string;
  readonly detail: string;
  readonly label?: string;
  readonly request?: { readonly path: string; readonly headers: Readonly<Record<string, string>>; readonly bodyBytes: number; readonly bodyHexHead: string };
}

/** One service and how many cases it gets in this campaign. */
export interface ServicePlan {
  readonly service: DescService;
  readonly cases: number;
}

/** Options of {@link runCampaign}. */
export interface CampaignOptions {
  readonly target: FuzzTarget;
  readonly plans: readonly ServicePlan[];
  readonly seed: number;
  readonly concurrency: number;
  readonly batchSize: number;
  readonly settings: InputSettings;
  /** Only run the case with this id (`Service#b<batch>.<index>`), for reproducing one. */
  readonly only?: string | undefined;
  /** Progress lines (one per few batches). */
  readonly log?: (line: string) => void;
}

/** What a campaign did and found. */
export interface CampaignResult {
  readonly cases: Record<string, number>;
  readonly codes: Record<string, Record<string, number>>;
  readonly violations: Violation[];
  readonly batches: number;
  /** Appends the service acknowledged, and journal lines checked against them. */
  readonly acknowledgedAppends: number;
  readonly journalLinesChecked: number;
  /** New journal lines explained only by an append whose answer was lost (deadline, cancel). */
  readonly unacknowledgedLines: number;
  readonly internalBySpec: number;
  readonly reconnects: number;
  /** HTTP/1.1 requests sent again after a reused keep-alive socket turned out closed. */
  readonly keepAliveRetries: number;
  /** Time spent waiting for answers, by answer code (where a campaign's time goes). */
  readonly secondsByCode: Record<string, number>;
  readonly writesTraced: number;
  readonly durationMs: number;
}

/** Codes that are never a proper answer to anything a client can send. */
const BAD_CODES = new Set(["internal", "unknown", "no_status", "hang", "connection_error"]);
/** Answers after which an append may or may not have been written. */
const LOST_ANSWERS = new Set(["deadline_exceeded", "canceled", "client_cancelled", "hang", "connection_error", "unavailable"]);

function deriveSeed(seed: number, ...parts: (string | number)[]): number {
  let h = seed >>> 0;
  for (const part of String(parts.join("/"))) h = (Math.imul(h ^ part.charCodeAt(0), 16777619) + 0x9e3779b9) >>> 0;
  return h | 0;
}

interface PlannedCase {
  readonly id: string;
  readonly service: DescService;
  readonly method: DescMethod;
  readonly fuzzCase: FuzzCase;
}

/** The case ids and recipes of batch `b` (the same for the same seed, whatever ran before). */
function planBatch(
  options: CampaignOptions,
  batch: number,
  remaining: Map<DescService, number>,
  arbitraries: Map<DescService, fc.Arbitrary<FuzzCase>>,
): PlannedCase[] {
  const total = options.plans.reduce((sum, p) => sum + p.cases, 0);
  const planned: PlannedCase[] = [];
  for (const plan of options.plans) {
    const left = remaining.get(plan.service) ?? 0;
    if (left <= 0) continue;
    const take = Math.min(left, Math.max(1, Math.round((options.batchSize * plan.cases) / total)));
    remaining.set(plan.service, left - take);
    const values = fc.sample(arbitraries.get(plan.service)!, { seed: deriveSeed(options.seed, plan.service.typeName, batch), numRuns: take });
    values.forEach((fuzzCase, i) => {
      planned.push({ id: `${plan.service.name}#b${batch}.${i}`, service: plan.service, method: plan.service.methods[fuzzCase.methodIndex]!, fuzzCase });
    });
  }
  // Interleave services so that their calls overlap.
  return planned.sort((a, b) => deriveSeed(options.seed, a.id) - deriveSeed(options.seed, b.id));
}

function requestOf(built: BuiltRequest): Violation["request"] {
  const bytes = requestBytes(built.wire);
  return { path: built.wire.path, headers: built.wire.headers, bodyBytes: bytes.byteLength, bodyHexHead: Buffer.from(bytes.subarray(0, 256)).toString("hex") };
}

/** Decodes an ok answer's messages (binary or JSON by how it was asked); throws when one does not parse. */
function decodeMessages(desc: DescMessage, answer: Answer): JsonValue[] {
  const json = (answer.contentType ?? "").includes("json");
  return answer.messages.map((bytes) => {
    const message = json ? fromJsonString(desc, Buffer.from(bytes).toString("utf8"), { ignoreUnknownFields: false }) : fromBinary(desc, bytes);
    return toJson(desc, message);
  });
}

/** The request as the server parsed it (for attributing a journal write), if this client can parse it too. */
function parsedRequest(method: DescMethod, built: BuiltRequest): Record<string, unknown> | undefined {
  if (built.messageBytes.byteLength === 0 && built.wire.chunks.length === 0) return undefined;
  const contentType = built.wire.headers["content-type"] ?? "";
  try {
    const message = contentType.includes("json")
      ? fromJsonString(method.input, Buffer.from(built.messageBytes).toString("utf8"), { ignoreUnknownFields: true })
      : fromBinary(method.input, built.messageBytes);
    return toJson(method.input, message) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

function collectTokens(value: JsonValue, pools: TokenPools, parentKey = ""): void {
  if (Array.isArray(value)) {
    for (const v of value) collectTokens(v, pools, parentKey);
    return;
  }
  if (value === null || typeof value !== "object") return;
  for (const [key, v] of Object.entries(value)) {
    if (key === "leaseToken" && typeof v === "string" && v !== "") remember(pools.lease, v);
    if (key === "id" && typeof v === "string" && v !== "") {
      if (parentKey === "reservation" || parentKey === "reservations") remember(pools.reservation, v);
      if (parentKey === "running") remember(pools.running, v);
    }
    collectTokens(v, pools, key);
  }
}

function remember(pool: string[], token: string): void {
  if (pool.includes(token)) return;
  pool.push(token);
  if (pool.length > 64) pool.shift();
}

/** Runs the campaign; never throws for what the service does (that is a violation), only for a broken setup. */
export async function runCampaign(options: CampaignOptions): Promise<CampaignResult> {
  const started = performance.now();
  const { target } = options;
  const lanes = Array.from({ length: options.concurrency }, () => new Http2Lane(target.url));
  const http1 = new Http1Client(target.url);
  const pools: TokenPools = { lease: [], reservation: [], running: [] };
  const remaining = new Map(options.plans.map((p) => [p.service, p.cases]));
  const arbitraries = new Map(options.plans.map((p) => [p.service, caseArbitrary(p.service.methods, options.settings)]));
  const cases: Record<string, number> = {};
  const codes: Record<string, Record<string, number>> = {};
  const violations: Violation[] = [];
  let acknowledgedAppends = 0;
  let journalLinesChecked = 0;
  let unacknowledgedLines = 0;
  let internalBySpec = 0;
  let writesTraced = 0;
  let serial = 0;
  const timeByCode: Record<string, number> = {};

  const excluded = [target.stateDir, path.join(target.root, "strace")];
  let tree = snapshotTree(target.root, excluded);
  let journals = journalDigests(target.stateDir);
  let running = runningIds(target.stateDir);
  // Appends answered with a lost answer may land after their batch: their sessions stay "maybe" one batch longer.
  let carriedMaybe = new Set<string>();
  // Sessions a DeleteSession whose answer was lost may have deleted, in this batch or the next.
  let carriedMaybeDeleted = new Set<string>();
  let carriedRunningLost = false;
  let batches = 0;
  let seenErrorLogs = 0;

  const violate = (v: Violation) => {
    violations.push(v);
    options.log?.(`VIOLATION ${v.kind} ${v.caseId}: ${v.detail}${v.label ? ` [${v.label}]` : ""}`);
  };

  for (let batch = 0; [...remaining.values()].some((n) => n > 0); batch++) {
    const planned = planBatch(options, batch, remaining, arbitraries).filter((c) => options.only === undefined || c.id === options.only);
    const ackedSeqs = new Map<string, Set<number>>();
    const lostSessions = new Set<string>();
    // Sessions deleted during the batch (an acknowledged DeleteSession), and those maybe deleted.
    const deletedSessions = new Set<string>();
    const maybeDeleted = new Set<string>();
    const ackedRunning = new Set<string>();
    let runningLost = false;

    let next = 0;
    const worker = async (lane: Http2Lane) => {
      while (next < planned.length) {
        const item = planned[next++]!;
        const serviceName = item.service.typeName;
        cases[serviceName] = (cases[serviceName] ?? 0) + 1;
        const count = (code: string) => {
          const byCode = (codes[serviceName] ??= {});
          byCode[code] = (byCode[code] ?? 0) + 1;
        };
        if (item.fuzzCase.transport === "socket") {
          const answer = await rawSocketCall(target.url, Uint8Array.from(item.fuzzCase.socketBytes), 5_000);
          count(`socket_${answer.outcome}`);
          if (answer.outcome === "hang") {
            violate({
              kind: "socket-hang",
              caseId: item.id,
              detail: `the server kept a connection open 5 s after the client sent ${item.fuzzCase.socketBytes.length} bytes of garbage and half-closed`,
              label: Buffer.from(item.fuzzCase.socketBytes.slice(0, 40)).toString("latin1"),
            });
          }
          continue;
        }
        const built = buildRequest(item.fuzzCase, item.method, pools, serial++, options.settings.maxMessageBytes);
        const answer = built.wire.httpVersion === 1 ? await http1.call(built.wire) : await lane.call(built.wire);
        count(answer.code);
        timeByCode[answer.code] = (timeByCode[answer.code] ?? 0) + answer.elapsedMs;
        const method = item.method;
        const isAppend = method.parent.typeName === "berth.sessions.v1.SessionService" && (method.name === "AppendEvent" || method.name === "AppendEvents");
        const isRegister = method.parent.typeName === "berth.budget.v1.BudgetService" && method.name === "RegisterRunning";
        const isDelete = method.parent.typeName === "berth.sessions.v1.SessionService" && method.name === "DeleteSession";

        // The answer itself.
        if (answer.code === "internal" && built.internalBySpec && answer.reason === "COMPRESSED_WITHOUT_ENCODING") {
          internalBySpec++;
        } else if (BAD_CODES.has(answer.code) || answer.code.startsWith("bad_") || (answer.code.startsWith("http_5") && answer.code !== "http_505")) {
          violate({
            kind: `answer-${answer.code}`,
            caseId: item.id,
            detail: `${answer.message} (HTTP ${answer.httpStatus ?? "-"}, ${Math.round(answer.elapsedMs)} ms)`,
            label: built.label,
            request: requestOf(built),
          });
        } else if (
          built.oversized &&
          !(["client_cancelled", "deadline_exceeded"].includes(answer.code) || (answer.code === "resource_exhausted" && answer.reason === "MESSAGE_TOO_LARGE"))
        ) {
          violate({
            kind: "oversize-not-resource-exhausted",
            caseId: item.id,
            detail: `${answer.code} ${answer.reason ?? "(no ErrorInfo)"}: ${answer.message}`,
            label: built.label,
            request: requestOf(built),
          });
        } else if (answer.code !== "ok" && (CODE_NAMES as readonly string[]).includes(answer.code) && answer.reason === undefined) {
          violate({
            kind: "error-without-error-info",
            caseId: item.id,
            detail: `${answer.code} without a google.rpc.ErrorInfo: ${answer.message}`,
            label: built.label,
            request: requestOf(built),
          });
        }

        // What an accepted call gave back must parse; tokens in it feed later cases.
        let decoded: JsonValue[] = [];
        if (answer.code === "ok" && answer.messages.length > 0) {
          try {
            decoded = decodeMessages(method.output, answer);
            for (const value of decoded) collectTokens(value, pools);
          } catch (error) {
            violate({ kind: "unparseable-response", caseId: item.id, detail: (error as Error).message, label: built.label, request: requestOf(built) });
          }
        }

        if (isAppend) {
          if (answer.code === "ok") {
            const response = decoded[0] as { seq?: string; firstSeq?: string; lastSeq?: string; duplicate?: boolean; snapshot?: { id?: string } } | undefined;
            const sessionId = response?.snapshot?.id ?? (parsedRequest(method, built)?.sessionId as string | undefined);
            if (response === undefined || sessionId === undefined) {
              violate({
                kind: "unattributable-append",
                caseId: item.id,
                detail: "an acknowledged append whose session and seq cannot be read from its answer",
                label: built.label,
              });
            } else if (response.duplicate !== true) {
              const first = Number(response.seq ?? response.firstSeq ?? 0);
              const last = Number(response.seq ?? response.lastSeq ?? 0);
              const seqs = ackedSeqs.get(sessionId) ?? new Set<number>();
              for (let s = first; s <= last && s > 0; s++) seqs.add(s);
              ackedSeqs.set(sessionId, seqs);
              acknowledgedAppends++;
            }
          } else if (LOST_ANSWERS.has(answer.code)) {
            const sessionId = parsedRequest(method, built)?.sessionId;
            lostSessions.add(typeof sessionId === "string" ? sessionId : "*");
          }
        }
        if (isDelete) {
          const sessionId = parsedRequest(method, built)?.sessionId;
          // A duplicate answers a deletion already made (maybe of an earlier incarnation) and deletes nothing now.
          const duplicate = (decoded[0] as { duplicate?: boolean } | undefined)?.duplicate === true;
          if (answer.code === "ok" && !duplicate) {
            if (typeof sessionId === "string") deletedSessions.add(sessionId);
            else
              violate({
                kind: "unattributable-delete",
                caseId: item.id,
                detail: "an acknowledged deletion whose session cannot be read from its request",
                label: built.label,
              });
          } else if (LOST_ANSWERS.has(answer.code)) {
            maybeDeleted.add(typeof sessionId === "string" ? sessionId : "*");
          }
        }
        if (isRegister) {
          if (answer.code === "ok") {
            for (const value of decoded) {
              const id = (value as { running?: { id?: string } }).running?.id;
              if (id !== undefined) ackedRunning.add(id);
            }
          } else if (LOST_ANSWERS.has(answer.code)) {
            runningLost = true;
          }
        }
      }
    };
    await Promise.all(lanes.map((lane) => worker(lane)));

    // The process is alive and serving.
    const exit = target.exitStatus();
    if (exit !== undefined) {
      violate({ kind: "crash", caseId: `batch ${batch}`, detail: `the service exited (${JSON.stringify(exit)}) during batch ${batch}\n${target.tail()}` });
      break;
    }
    const viaHttp1 = await healthCheckOnce(target.url).catch((error: Error) => `no answer: ${error.message}`);
    const viaGrpc = await grpcHealth(target.url);
    if (viaHttp1 !== "SERVING" || viaGrpc !== "SERVING") {
      violate({ kind: "not-serving", caseId: `batch ${batch}`, detail: `health after batch ${batch}: Connect/HTTP1 ${viaHttp1}, gRPC ${viaGrpc}` });
    }
    const errorLogs = target.errorLogs();
    for (const line of errorLogs.slice(seenErrorLogs)) violate({ kind: "error-log", caseId: `batch ${batch}`, detail: line.slice(0, 600) });
    seenErrorLogs = errorLogs.length;

    // Nothing written outside the state directory.
    const writes = target.newWrites();
    writesTraced += writes.count;
    for (const outside of writes.outside) violate({ kind: "write-outside-state", caseId: `batch ${batch}`, detail: outside });
    for (const lock of writes.lockFiles) {
      if (!isLockFileAllowed(lock, target)) violate({ kind: "lock-file-outside-locks", caseId: `batch ${batch}`, detail: lock });
    }
    const nextTree = snapshotTree(target.root, excluded);
    for (const change of diffTrees(tree, nextTree)) violate({ kind: "sandbox-changed", caseId: `batch ${batch}`, detail: change });
    tree = nextTree;

    // Journals: every new line is an acknowledged append of this batch (or one whose answer was lost), none is missing, old bytes untouched.
    const nextJournals = journalDigests(target.stateDir);
    const sessions = new Set([...nextJournals.keys(), ...journals.keys(), ...ackedSeqs.keys()]);
    for (const sessionId of sessions) {
      const before: JournalDigest | undefined = journals.get(sessionId);
      const after = nextJournals.get(sessionId);
      const acked = ackedSeqs.get(sessionId) ?? new Set<number>();
      if ([maybeDeleted, carriedMaybeDeleted].some((set) => set.has(sessionId) || set.has("*"))) continue;
      if (deletedSessions.has(sessionId)) {
        // Deleted during the batch: what its journal holds now (if anything) was appended after
        // that, in this batch; acknowledged appends from before the deletion are gone with it.
        if (after === undefined) continue;
        const change = journalChange(target.stateDir, sessionId, undefined);
        if (change.badLines > 0)
          violate({ kind: "journal-bad-line", caseId: `batch ${batch}`, detail: `${sessionId}: ${change.badLines} lines without a seq after a deletion` });
        const maybe = [lostSessions, carriedMaybe].some((set) => set.has(sessionId) || set.has("*"));
        for (const seq of change.newSeqs) {
          journalLinesChecked++;
          if (acked.has(seq)) continue;
          if (maybe) unacknowledgedLines++;
          else
            violate({
              kind: "journal-changed-without-ack",
              caseId: `batch ${batch}`,
              detail: `${sessionId}: seq ${seq} written after a deletion, but no call of this batch was acknowledged with it`,
            });
        }
        continue;
      }
      if (after === undefined) {
        if (before !== undefined) violate({ kind: "journal-removed", caseId: `batch ${batch}`, detail: sessionId });
        if (acked.size > 0)
          violate({
            kind: "acknowledged-append-missing",
            caseId: `batch ${batch}`,
            detail: `${sessionId}: seqs ${[...acked].join(",")} acknowledged, no journal`,
          });
        continue;
      }
      if (before !== undefined && before.sha === after.sha && before.size === after.size) {
        if (acked.size > 0)
          violate({
            kind: "acknowledged-append-missing",
            caseId: `batch ${batch}`,
            detail: `${sessionId}: seqs ${[...acked].join(",")} acknowledged, journal unchanged`,
          });
        continue;
      }
      const change = journalChange(target.stateDir, sessionId, before);
      if (change.rewritten) violate({ kind: "journal-rewritten", caseId: `batch ${batch}`, detail: `${sessionId}: bytes before this batch changed` });
      if (change.badLines > 0)
        violate({ kind: "journal-bad-line", caseId: `batch ${batch}`, detail: `${sessionId}: ${change.badLines} new lines without a seq` });
      const maybe = [lostSessions, carriedMaybe].some((set) => set.has(sessionId) || set.has("*"));
      for (const seq of change.newSeqs) {
        journalLinesChecked++;
        if (acked.delete(seq)) continue;
        if (maybe) unacknowledgedLines++;
        else
          violate({
            kind: "journal-changed-without-ack",
            caseId: `batch ${batch}`,
            detail: `${sessionId}: seq ${seq} written, but no call of this batch was acknowledged with it`,
          });
      }
      if (acked.size > 0)
        violate({
          kind: "acknowledged-append-missing",
          caseId: `batch ${batch}`,
          detail: `${sessionId}: seqs ${[...acked].join(",")} acknowledged but not in the new lines`,
        });
    }
    journals = nextJournals;
    carriedMaybe = lostSessions;
    carriedMaybeDeleted = maybeDeleted;

    // The running tally: a new entry comes from an acknowledged registration.
    const nextRunning = runningIds(target.stateDir);
    for (const id of nextRunning) {
      if (running.has(id) || ackedRunning.has(id) || runningLost || carriedRunningLost) continue;
      violate({ kind: "running-tally-changed-without-ack", caseId: `batch ${batch}`, detail: id });
    }
    running = nextRunning;
    carriedRunningLost = runningLost;
    batches++;

    if (batch % 5 === 4) {
      const done = Object.values(cases).reduce((a, b) => a + b, 0);
      options.log?.(`${done} cases after batch ${batch} (${Math.round((performance.now() - started) / 1000)} s), ${violations.length} violations`);
    }
  }

  for (const lane of lanes) lane.close();
  http1.close();
  return {
    cases,
    codes,
    violations,
    batches,
    acknowledgedAppends,
    journalLinesChecked,
    unacknowledgedLines,
    internalBySpec,
    reconnects: lanes.reduce((sum, lane) => sum + lane.reconnects, 0),
    keepAliveRetries: http1.keepAliveRetries,
    secondsByCode: Object.fromEntries(Object.entries(timeByCode).map(([code, ms]) => [code, Math.round(ms / 100) / 10])),
    writesTraced,
    durationMs: performance.now() - started,
  };
}

/** Lock files belong in `<state>/locks/`; the election lock sits at `<state>/<kind>.lock`. */
export function isLockFileAllowed(file: string, target: FuzzTarget): boolean {
  const locks = path.join(target.stateDir, "locks");
  return file.startsWith(`${locks}/`) || file === path.join(target.stateDir, `${target.kind}.lock`);
}

/** Health Check over gRPC on a fresh HTTP/2 connection: the status name, or what went wrong. */
async function grpcHealth(url: string): Promise<string> {
  const lane = new Http2Lane(url);
  try {
    const answer = await lane.call({
      protocol: "grpc",
      httpVersion: 2,
      path: "/grpc.health.v1.Health/Check",
      headers: { "content-type": "application/grpc", te: "trailers", "grpc-timeout": "5S" },
      chunks: [envelope(0, toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, {})))],
      requestEnd: "end",
      settle: "status",
      timeoutMs: 6_000,
      streamingResponse: false,
    });
    if (answer.code !== "ok" || answer.messages[0] === undefined) return `${answer.code}: ${answer.message}`;
    const status = fromBinary(HealthCheckResponseSchema, answer.messages[0]).status;
    return status === 1 ? "SERVING" : `status ${status}`;
  } finally {
    lane.close();
  }
}
