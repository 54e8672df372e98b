/**
 * The end-to-end test harness: run the built berth services as real processes and talk to them
 * with independent clients.
 *
 * Processes (`harness/processes.ts`):
 * - `startService(kind, { stateDir?, args?, env?, umask? })` spawns `sessions`, `budget` or `up`
 *   (`berth up`) from `dist/` on ephemeral ports (`--*-port 0`) with `--log-level info` and a fresh
 *   state dir (`<temp>/state`, created by the service itself), and resolves once every "listening"
 *   log line is in (15 s at most; the error carries the process's output). The handle gives
 *   `url("sessions")`, `urls`, `pid`, `stateDir`, `logs()`/`entries()`/`stderr()`, `waitForLog()`,
 *   `stop(signal = "SIGTERM")` → `{code, signal}` and `kill()` (SIGKILL).
 * - `launchService(...)` does not wait: `outcome` settles as listening or exited (races, refusals).
 * - `stopAll()` kills what is still running (only processes started here), closes the clients and
 *   removes the temp dirs: use it in `afterAll`/`afterEach`. `makeTempDir()` for extra dirs.
 * - `listeningSockets(pid)`: the TCP addresses a process really listens on (from /proc).
 * - The child never inherits `BERTH_*`/`BACKLOT_*` variables from the test's environment; pass
 *   settings through `args` or `env`. Its stdout is always drained (a service whose stdout is not
 *   read blocks in its logger).
 *
 * Clients (`harness/clients.ts`, `harness/commands.ts`):
 * - `grpcJsHealthClient(url)`: health Check/Watch on @grpc/grpc-js + proto-loader (proto/ only).
 * - `grpcJsClient(url, { token })`: any berth RPC on grpc-js (unary, server stream, bidi), messages
 *   from the generated descriptors (`SessionService.method.getSnapshot`).
 * - `connectClient(Service, url, { protocol: "grpc" | "connect" | "grpc-web", token, httpVersion })`.
 * - `curlJson(url, "/pkg.Service/Method", body, headers?)` → `{status, json}` (real curl, HTTP/1.1);
 *   `curl(url, path, options)` for anything else (`/metrics`).
 * - `bufCurl([...flags, url])`: `buf curl`, a client whose schema comes from reflection alone;
 *   `grpcCode` is the call's gRPC status (buf exits with it shifted left by 3).
 * - `runCommand(cmd, args, { input, timeoutMs, env })` for any other command (the `berth` CLI).
 * - `runSteps(cmd, args, { env, cwd, label })`: a client in another language that reports JSON-line
 *   steps and waits for go-aheads on stdin (`harness/steps.ts`).
 *
 * The tests spawn what `npm test` built (`pretest` runs `tsc -b`); they never build by themselves.
 * If `dist/` is missing the harness says "run npm run build".
 *
 * ```ts
 * import { afterAll, expect, it } from "vitest";
 * import { grpcJsHealthClient, startService, stopAll } from "./harness.js";
 *
 * afterAll(stopAll);
 * it("serves", async () => {
 *   const service = await startService("sessions");
 *   const health = grpcJsHealthClient(service.url("sessions"));
 *   expect((await health.check()).status).toBe("SERVING");
 *   expect(await service.stop()).toEqual({ code: 0, signal: null });
 * });
 * ```
 */
export {
  DEFAULT_READY_TIMEOUT_MS,
  type ExitStatus,
  healthCheckOnce,
  type LaunchOutcome,
  launchService,
  type ListeningSocket,
  listeningSockets,
  type LogEntry,
  makeTempDir,
  onStopAll,
  runningServices,
  type ServiceOptions,
  type ServiceProcess,
  type ServiceUrls,
  type StartedService,
  startService,
  stopAll,
} from "./harness/processes.js";
export {
  callFailure,
  closeClient,
  connectClient,
  type ConnectClientOptions,
  type ConnectProtocol,
  EVERY_PROTOCOL,
  grpcCodeName,
  type GrpcError,
  grpcErrorInfo,
  type GrpcJsCallOptions,
  type GrpcJsClient,
  grpcJsClient,
  type GrpcJsHealthClient,
  grpcJsHealthClient,
  grpcJsTarget,
  GrpcStatus,
  type GrpcStatusDetails,
  grpcStatusDetails,
  type HealthCheckResponse,
  isGrpcError,
  type NamedProtocol,
  PROTOCOLS,
} from "./harness/clients.js";
export {
  bufCurl,
  type BufCurlResult,
  type CommandOptions,
  type CommandResult,
  curl,
  curlJson,
  type CurlJsonResponse,
  type CurlOptions,
  type CurlResponse,
  runCommand,
} from "./harness/commands.js";
export { runSteps, type Step, type StepOptions, type StepRun } from "./harness/steps.js";
export { onStore, type StoreKind, STORES, storeTags, testEtcd } from "./harness/stores.js";
export { type CuttableProxy, cuttableProxy } from "./harness/cuttable-proxy.js";
export { bufBinary, entryPoint, REPO_ROOT, repoPath, SERVERS_OF, type ServiceKind } from "./harness/repo.js";
