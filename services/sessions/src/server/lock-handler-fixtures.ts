/**
 * For the lock handlers' tests: a lock service on a manual clock in a temp dir, a client of its
 * handlers over an in-memory transport, a Hold stream collected as it arrives, and what a refusal
 * carries.
 *
 * The service's parts are exported `let`s, which ES modules bind live: `setUpLockService` (for
 * `beforeEach`) and `serve` replace them, and the tests see the current ones.
 */
import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { durationFromMs, type Duration } from "@bufbuild/protobuf/wkt";
import { ConnectError, createClient, createRouterTransport, type Client } from "@connectrpc/connect";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { LockService as LockServiceDesc, type HoldResponse } from "@berth/api/berth/locks/v1/lock_service_pb";
import { ManualClock } from "@berth/shared/clock";
import { createErrorInterceptor, createObserverInterceptor, ServerMetrics } from "@berth/shared/server/index";
import { createSourceLocks, type LockLimits, type SourceLocks } from "../locks/index.js";
import { createLockHandlers } from "./lock-handlers.js";

export let root: string;
export let projectRoot: string;
export let liveDir: string;
export let clock: ManualClock;
export let locks: SourceLocks;
export let client: Client<typeof LockServiceDesc>;
export let metrics: ServerMetrics;

/** The locked file: absolute, as every client sends it. */
export let FILE: string;
export const key = () => FILE;
export const HEARTBEAT_MS = 1_000;

/** A lock service with `limits` and a client of its handlers, replacing the ones of beforeEach. */
export function serve(limits?: Partial<LockLimits>): void {
  locks?.close();
  locks = createSourceLocks({ projectRoot, stateDir: path.join(root, "state"), liveDir, clock, ...(limits === undefined ? {} : { limits }) });
  const quiet = { debug() {}, info() {}, warn() {}, error() {} };
  const transport = createRouterTransport((router) => router.service(LockServiceDesc, createLockHandlers({ locks, clock, heartbeatMs: HEARTBEAT_MS })), {
    // As the server has them: the observer (which keeps the open streams) outermost.
    router: { interceptors: [createObserverInterceptor({ logger: quiet, metrics }), createErrorInterceptor()] },
  });
  client = createClient(LockServiceDesc, transport);
}

/** For `beforeEach`: a temp dir, a clock, metrics and a lock service of their own. */
export function setUpLockService(): void {
  root = fs.mkdtempSync(path.join(tmpdir(), "berth-lockrpc-"));
  projectRoot = path.join(root, "project");
  FILE = path.join(projectRoot, "src/app.ts");
  liveDir = path.join(root, "live");
  clock = new ManualClock();
  metrics = new ServerMetrics("sessions");
  serve();
}

/** For `afterEach`. */
export function closeLockService(): void {
  locks.close();
  fs.rmSync(root, { recursive: true, force: true });
}

export const ms = (n: number): Duration => durationFromMs(n);

export { connectFailure as failure } from "@berth/shared/server/testing/connect-failure";

/** The ErrorInfo reason and domain, and the RetryInfo delay (ms) of a refusal. */
export function errorInfo(error: ConnectError) {
  const [info] = error.findDetails(ErrorInfoSchema);
  const [retry] = error.findDetails(RetryInfoSchema);
  return {
    reason: info?.reason,
    domain: info?.domain,
    retryAfterMs: retry?.retryDelay === undefined ? undefined : Number(retry.retryDelay.seconds) * 1000 + retry.retryDelay.nanos / 1e6,
  };
}

/** Collects a Hold stream's messages as they arrive, and how it ended. */
export function openHold(request: { file?: string; owner: string; maxWait?: Duration }) {
  const controller = new AbortController();
  const messages: HoldResponse[] = [];
  let ended: ConnectError | "ok" | undefined;
  const done = (async () => {
    try {
      for await (const message of client.hold({ file: request.file ?? FILE, owner: request.owner, maxWait: request.maxWait }, { signal: controller.signal }))
        messages.push(message);
      ended = "ok";
    } catch (error) {
      ended = ConnectError.from(error);
    }
  })();
  return {
    messages,
    cancel: () => controller.abort(),
    done,
    get ended() {
      return ended;
    },
    kinds: () => messages.map((m) => m.kind.case),
  };
}
