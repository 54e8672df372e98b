/**
 * What a failed RPC means for a command: the exit code (see `EXIT`) and a one-line message. Every
 * command maps errors here, so the same refusal exits the same way whichever command met it.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { EXIT } from "../command.js";
import { styleFor } from "../terminal.js";

/** The exit code and message for a failed call to the service at `url`. */
export interface Failure {
  readonly exit: number;
  /** The gRPC code in snake case (`not_found`, `unavailable`), for JSON output. */
  readonly code: string;
  /** The case the service named in its `google.rpc.ErrorInfo` (`SEQ_CONFLICT`, `MESSAGE_TOO_LARGE`); undefined when none came. */
  readonly reason?: string | undefined;
  readonly message: string;
}

/** A failure's fields in a JSON error line: the code, the reason when the service named one, the exit code and the message. */
export function failureFields(failure: Failure): Record<string, unknown> {
  return { code: failure.code, ...(failure.reason === undefined ? {} : { reason: failure.reason }), exit: failure.exit, message: failure.message };
}

// Node's errors for a peer that is not there (or went away): the service is not reachable.
const UNREACHABLE_ERRNOS = new Set(["ECONNREFUSED", "ENOENT", "ECONNRESET", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT", "EPIPE", "EADDRNOTAVAIL"]);

/** The exit code and message for `error`, thrown by a call to the service `service` at `url`. */
export function describeFailure(error: unknown, service: string, url: string): Failure {
  const connectError = ConnectError.from(error);
  const errno = causeErrno(error);
  if (errno !== undefined && UNREACHABLE_ERRNOS.has(errno)) {
    return {
      exit: EXIT.unreachable,
      code: "unavailable",
      message: `cannot reach the ${service} service at ${url} (${errno}); is it running? ('berth up' starts it)`,
    };
  }
  const failure = failureOf(connectError, service, url);
  const reason = connectError.findDetails(ErrorInfoSchema)[0]?.reason;
  return reason === undefined || reason === "" ? failure : { ...failure, reason };
}

function failureOf(connectError: ConnectError, service: string, url: string): Failure {
  const message = connectError.rawMessage;
  const code = codeName(connectError.code);
  switch (connectError.code) {
    // Not serving (shutting down, or not there at all).
    case Code.Unavailable:
      return { exit: EXIT.unreachable, code, message: `the ${service} service at ${url} is unavailable: ${message}` };
    // The call's own deadline ran out: the service is there but does not answer.
    case Code.DeadlineExceeded:
      return { exit: EXIT.unreachable, code, message: `the ${service} service at ${url} did not answer in time: ${message}` };
    // The service refused an argument (or a position past the end): the same call will fail again.
    case Code.InvalidArgument:
    case Code.OutOfRange:
      return { exit: EXIT.usage, code, message };
    case Code.NotFound:
      return { exit: EXIT.notFound, code, message };
    // The state moved on (an expected seq, a lost fence, an idempotency key used for other
    // events): look again before retrying.
    case Code.FailedPrecondition:
    case Code.Aborted:
    case Code.AlreadyExists:
      return { exit: EXIT.conflict, code, message };
    case Code.Unauthenticated:
    case Code.PermissionDenied:
      return { exit: EXIT.denied, code, message: `${message} (set BERTH_TOKEN or --token-file)` };
    default:
      return { exit: EXIT.failed, code, message: `${code}: ${message}` };
  }
}

/**
 * Prints `failure` on stderr and returns its exit code: a JSON line
 * (`{"event":"error","code":…,"reason":…,"exit":…,"message":…}`) under `--json`, else `<command>: <message>`.
 */
export function reportFailure(command: string, failure: Failure, json: boolean): number {
  if (json) process.stderr.write(`${JSON.stringify({ event: "error", ...failureFields(failure) })}\n`);
  else process.stderr.write(`${command}: ${styleFor(process.stderr).red(failure.message)}\n`);
  return failure.exit;
}

function causeErrno(error: unknown): string | undefined {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === "string" && /^E[A-Z]+$/.test(code)) return code;
  }
  return undefined;
}

function codeName(code: Code): string {
  return (Code[code] ?? String(code)).replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
}
