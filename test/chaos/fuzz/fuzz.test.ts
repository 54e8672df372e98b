/**
 * Reliability suite: bad input (docs/architecture.md, "Tests and benchmarks"). For every RPC of
 * every service — SessionService and LockService on a sessions process, BudgetService on a budget
 * process, health and reflection on both, all enumerated from the generated descriptors — a seeded
 * fast-check fuzzer sends random and mutated requests: protobuf built from the descriptors with
 * random field values and then mutated byte by byte, random JSON of right and wrong types, huge
 * strings and numbers, NaN and Infinity, negative and out-of-range durations, ids with `..`, `/`,
 * NUL and unicode, messages over the size limit, gzip bombs, truncated and mislabelled envelopes,
 * wrong content types and headers, bidi calls over HTTP/1.1, and bytes that are not HTTP at all;
 * through gRPC (raw HTTP/2 frames from node:http2) and Connect (HTTP/1.1 and HTTP/2). Streaming
 * calls get a first message and are then cancelled, half-closed or left to their deadline.
 *
 * Promises checked (a broken one is a violation; the suite needs 0):
 * - every answer is a proper status (a gRPC status, a Connect error code, or an HTTP refusal such
 *   as 415 or 505), never INTERNAL or UNKNOWN, never a missing status, a reset or a hang (no answer
 *   4 s past the call's deadline, 5 s at least); every error carries a `google.rpc.ErrorInfo`
 *   naming its case; a valid message over the limit is RESOURCE_EXHAUSTED MESSAGE_TOO_LARGE (or
 *   its deadline ran out first); an accepted answer parses. Counted apart, not violations: the
 *   INTERNAL COMPRESSED_WITHOUT_ENCODING the gRPC compression spec demands for a compressed flag
 *   without an encoding (`internalBySpec`), and a connection reset during the upload of a bidi call over
 *   HTTP/1.1, which connect refuses with 505 and "Connection: close" before reading the body
 *   (`closed_during_upload`);
 * - after every batch the process is alive and health answers SERVING over gRPC and Connect;
 * - nothing is written outside the state directory: the service runs with its cwd, HOME and
 *   TMPDIR in a sandbox whose tree is compared after every batch, writes are traced with strace
 *   where the machine allows it (lock files only under `<state>/locks`), and traversal attempts aim
 *   at `/tmp/<marker>` names that are looked for at the end;
 * - no journal changes on a refused call: after every batch each new journal line must be an
 *   append acknowledged in that batch (or one whose answer was lost to a deadline or cancel), none
 *   acknowledged may be missing, old bytes never change; likewise new entries of the budget's
 *   running tally.
 *
 * Knobs (environment): BERTH_CHAOS_FUZZ_CASES (per service, default 10,000; health gets that many
 * in all, split between the two processes, reflection a tenth), _FUZZ_SEED (default: random,
 * printed), _FUZZ_CONCURRENCY (calls in flight per process, 8), _FUZZ_BATCH (250),
 * _FUZZ_SEQUENTIAL=1 (one process after the other instead of side by side), _FUZZ_NO_TRACE=1
 * (no strace), BERTH_CHAOS_FUZZ_ONLY=<case id, e.g. SessionService#b3.41> to send only that case of
 * a seed. Every violation is printed with its case id, a description and the request (headers and
 * first bytes), and all of them are written to a JSON file named in the output.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import type { DescService } from "@bufbuild/protobuf";
import { afterAll, expect, it } from "vitest";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { ServerReflection as ReflectionV1 } from "@berth/api/grpc/reflection/v1/reflection_pb";
import { ServerReflection as ReflectionV1alpha } from "@berth/api/grpc/reflection/v1alpha/reflection_pb";
import { runCampaign, isLockFileAllowed, type CampaignResult, type ServicePlan, type Violation } from "./fuzz-run.js";
import { listing, lockFilesUnder, startTarget, writtenPaths, type FuzzTarget } from "./fuzz-target.js";
import { chaosSetting, reportSuite } from "../common/summary.js";

const CASES = chaosSetting("FUZZ_CASES", 10_000);
const SEED = chaosSetting("FUZZ_SEED", 1 + Math.floor(Math.random() * 2 ** 30));
const CONCURRENCY = chaosSetting("FUZZ_CONCURRENCY", 8);
const BATCH = chaosSetting("FUZZ_BATCH", 250);
/** A case id as printed (`sessions/SessionService#b3.41`) or without its process (`SessionService#b3.41`). */
const ONLY = process.env.BERTH_CHAOS_FUZZ_ONLY?.replace(/^[a-z]+\//, "");
/** BERTH_CHAOS_FUZZ_NO_TRACE=1 skips strace (the sandbox snapshots still run). */
const TRACE = chaosSetting("FUZZ_NO_TRACE", 0) === 0;
const SEQUENTIAL = chaosSetting("FUZZ_SEQUENTIAL", 0) === 1;
const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

const targets: FuzzTarget[] = [];
const extraDirs: string[] = [];

afterAll(async () => {
  for (const target of targets) {
    await target.stop(5_000).catch(() => undefined);
    target.remove();
  }
  for (const dir of extraDirs) rmSync(dir, { recursive: true, force: true });
});

/** A proc tree of a big, quiet machine, so the budget admits most sane requests at once. */
function fakeMachine(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "berth-fuzz-proc-"));
  extraDirs.push(dir);
  const proc = path.join(dir, "proc");
  mkdirSync(proc);
  writeFileSync(path.join(proc, "meminfo"), "MemTotal:       214748364800 kB\nMemFree:        214748364800 kB\nMemAvailable:   214748364800 kB\n");
  writeFileSync(path.join(proc, "loadavg"), "0.00 0.00 0.00 1/100 4242\n");
  return proc;
}

/** Every service a process serves, each with its share of cases: its own in full, the built-in ones split between the two processes. */
function plansFor(own: readonly DescService[]): ServicePlan[] {
  return [
    ...own.map((service) => ({ service, cases: CASES })),
    { service: Health, cases: Math.ceil(CASES / 2) },
    { service: ReflectionV1, cases: Math.ceil(CASES / 20) },
    { service: ReflectionV1alpha, cases: Math.ceil(CASES / 20) },
  ];
}

function describeViolation(v: Violation): string {
  const request = v.request
    ? `\n    request: POST ${v.request.path} ${JSON.stringify(v.request.headers)} body ${v.request.bodyBytes} bytes, head ${v.request.bodyHexHead.slice(0, 160)}`
    : "";
  return `  [${v.kind}] ${v.caseId}: ${v.detail.slice(0, 500)}${v.label ? `\n    case: ${v.label}` : ""}${request}`;
}

/** `-xx` spelling of a string, as strace prints it. */
const hex = (text: string) => [...Buffer.from(text, "utf8")].map((b) => `\\x${b.toString(16).padStart(2, "0")}`).join("");

it("reads the writes in strace's output that the write check relies on", () => {
  const lines = [
    `openat(AT_FDCWD<${hex("/w")}>, "${hex("a.jsonl")}", O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, 0600) = 21<${hex("/s/sessions/a.jsonl")}>`,
    `openat(AT_FDCWD<${hex("/w")}>, "${hex("/etc/hosts")}", O_RDONLY|O_CLOEXEC) = 22<${hex("/etc/hosts")}>`,
    `rename("${hex("/s/x.tmp")}", "${hex("/tmp/é")}") = 0`,
    `unlinkat(5<${hex("/s/locks")}>, "${hex("../../tmp/y")}", 0) = 0`,
    `mkdir("${hex("rel")}", 0700) = 0`,
    `symlinkat("${hex("/etc/passwd")}", AT_FDCWD<${hex("/w")}>, "${hex("link")}") = 0`,
  ];
  expect(lines.flatMap((line) => writtenPaths(line, "/w"))).toEqual([
    { syscall: "openat", path: "/s/sessions/a.jsonl" },
    { syscall: "rename", path: "/s/x.tmp" },
    { syscall: "rename", path: "/tmp/é" },
    { syscall: "unlinkat", path: "/tmp/y" },
    { syscall: "mkdir", path: "/w/rel" },
    { syscall: "symlinkat", path: "/w/link" },
  ]);
});

it(`answers ${CASES} fuzzed requests per service with proper statuses, stays up, writes only its state, and changes no journal on a refusal`, async () => {
  const started = performance.now();
  const marker = `berthfuzz-${SEED}`;
  const tmpBefore = listing(tmpdir());
  process.stdout.write(
    `fuzz: seed ${SEED} (replay with BERTH_CHAOS_FUZZ_SEED=${SEED}), ${CASES} cases per service, ${CONCURRENCY} in flight, batches of ${BATCH}\n`,
  );
  const log = (line: string) => process.stdout.write(`fuzz: ${line}\n`);

  const runs: { kind: string; target: FuzzTarget; result: CampaignResult }[] = [];
  const settings = { sessionIds: ["fz-1", "fz-2", "fz-3", "fz_4", "F-5"], marker, maxMessageBytes: MAX_MESSAGE_BYTES };
  const violations: Violation[] = [];

  const campaign = async (kind: "sessions" | "budget", own: readonly DescService[], args: readonly string[]) => {
    const target = await startTarget(kind, { args, trace: TRACE });
    targets.push(target);
    log(
      `${kind} pid ${target.pid} at ${target.url}, sandbox ${target.root}, writes ${target.traced ? "traced with strace" : "not traced (no strace): sandbox snapshots only"}`,
    );
    const result = await runCampaign({
      target,
      plans: plansFor(own),
      seed: SEED,
      concurrency: CONCURRENCY,
      batchSize: BATCH,
      settings,
      only: ONLY,
      log: (line) => log(`${kind}: ${line}`),
    });
    log(
      `${kind}: ${Object.values(result.cases).reduce((a, b) => a + b, 0)} cases in ${Math.round(result.durationMs / 1000)} s; answer time by code (s): ${JSON.stringify(result.secondsByCode)}`,
    );
    runs.push({ kind, target, result });
    violations.push(...result.violations.map((v) => ({ ...v, caseId: `${kind}/${v.caseId}` })));

    // A process that took all that still stops cleanly, and its lock files are where they belong.
    const exit = await target.stop();
    if (exit.code !== 0) violations.push({ kind: "unclean-exit", caseId: kind, detail: `exit ${JSON.stringify(exit)} after the campaign\n${target.tail()}` });
    const finalWrites = target.newWrites();
    for (const outside of finalWrites.outside) violations.push({ kind: "write-outside-state", caseId: `${kind} shutdown`, detail: outside });
    for (const lock of [...lockFilesUnder(target.stateDir), ...finalWrites.lockFiles]) {
      if (!isLockFileAllowed(lock, target)) violations.push({ kind: "lock-file-outside-locks", caseId: kind, detail: lock });
    }
  };
  const campaigns = [
    () => campaign("sessions", [SessionService, LockService], ["--fsync", "batch"]),
    () =>
      campaign(
        "budget",
        [BudgetService],
        [`--proc-root=${fakeMachine()}`, "--cgroup-root=/nonexistent", "--sample-interval=200ms", "--memory=100T", "--cpu=100000", "--max-queue=64"],
      ),
  ];
  // Each service process has its own CONCURRENCY lanes; the two run side by side (each server is
  // one thread) unless BERTH_CHAOS_FUZZ_SEQUENTIAL=1.
  if (SEQUENTIAL) for (const run of campaigns) await run();
  else await Promise.all(campaigns.map((run) => run()));

  // Traversal attempts aimed at /tmp/<marker>...: nothing of that name may exist.
  const tmpAfter = listing(tmpdir());
  const newTmp = [...tmpAfter].filter((name) => !tmpBefore.has(name));
  for (const name of newTmp.filter((n) => n.includes(marker)))
    violations.push({ kind: "write-outside-state", caseId: "tmp listing", detail: path.join(tmpdir(), name) });

  const sum = (pick: (r: CampaignResult) => number) => runs.reduce((total, run) => total + pick(run.result), 0);
  const cases: Record<string, number> = {};
  const codes: Record<string, Record<string, number>> = {};
  for (const run of runs) {
    for (const [service, n] of Object.entries(run.result.cases)) cases[service] = (cases[service] ?? 0) + n;
    for (const [service, byCode] of Object.entries(run.result.codes)) {
      const merged = (codes[service] ??= {});
      for (const [code, n] of Object.entries(byCode)) merged[code] = (merged[code] ?? 0) + n;
    }
  }
  const byKind: Record<string, number> = {};
  for (const v of violations) byKind[v.kind] = (byKind[v.kind] ?? 0) + 1;
  if (violations.length > 0) {
    const reportFile = path.join(tmpdir(), `berth-fuzz-violations-${SEED}.json`);
    writeFileSync(reportFile, JSON.stringify(violations, null, 1));
    process.stdout.write(`fuzz: every violation with its request: ${reportFile}\n`);
    process.stdout.write(`fuzz: ${violations.length} violations (seed ${SEED}); first ones:\n${violations.slice(0, 25).map(describeViolation).join("\n")}\n`);
  }
  reportSuite({
    suite: "fuzz",
    rounds: sum((r) => r.batches),
    operations: Object.values(cases).reduce((a, b) => a + b, 0),
    violations: violations.length,
    seed: SEED,
    durationS: Math.round((performance.now() - started) / 100) / 10,
    cases,
    codes,
    violationsByKind: byKind,
    acknowledgedAppends: sum((r) => r.acknowledgedAppends),
    journalLinesChecked: sum((r) => r.journalLinesChecked),
    linesOfLostAnswers: sum((r) => r.unacknowledgedLines),
    internalBySpec: sum((r) => r.internalBySpec),
    writesTraced: runs.every((r) => r.target.traced) ? sum((r) => r.writesTraced) : "not traced",
    reconnects: sum((r) => r.reconnects),
    keepAliveRetries: sum((r) => r.keepAliveRetries),
    otherNewTmpEntries: newTmp.length,
  });
  // The message's first line names the kinds and the seed: CI prints only that line of a failure.
  expect(violations.map(describeViolation), `seed ${SEED}, violations ${JSON.stringify(byKind)}`).toEqual([]);
});
