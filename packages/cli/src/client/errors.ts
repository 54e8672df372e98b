/**
 * What a failed RPC means for a command: the exit code (see `EXIT`) and a one-line message. Every
 * command maps errors here, so the same refusal exits the same way whichever command met it.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { EXIT } from "../command.js";

/** The exit code and message for a failed call to the service at `url`. */
export interface Failure {
  readonly exit: number;
  readonly message: string;
}

// Node's errors for a peer that is not there (or went away): the service is not reachable.
const UNREACHABLE_ERRNOS = new Set(["ECONNREFUSED", "ENOENT", "ECONNRESET", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT", "EPIPE", "EADDRNOTAVAIL"]);

/** The exit code and message for `error`, thrown by a call to the service `service` at `url`. */
export function describeFailure(error: unknown, service: string, url: string): Failure {
  const connectError = ConnectError.from(error);
  const errno = causeErrno(error);
  if (errno !== undefined && UNREACHABLE_ERRNOS.has(errno)) {
    return { exit: EXIT.unreachable, message: `cannot reach the ${service} service at ${url} (${errno}); is it running? ('berth up' starts it)` };
  }
  const message = connectError.rawMessage;
  switch (connectError.code) {
    // Not serving (shutting down, or not there at all).
    case Code.Unavailable:
      return { exit: EXIT.unreachable, message: `the ${service} service at ${url} is unavailable: ${message}` };
    // The service refused an argument: the same call will fail again.
    case Code.InvalidArgument:
      return { exit: EXIT.usage, message };
    case Code.NotFound:
      return { exit: EXIT.notFound, message };
    // The state moved on (an expected seq, a lost fence): re-read and retry.
    case Code.FailedPrecondition:
    case Code.Aborted:
      return { exit: EXIT.conflict, message };
    case Code.Unauthenticated:
      return { exit: EXIT.denied, message: `${message} (set BERTH_TOKEN or --token-file)` };
    default:
      return { exit: EXIT.failed, message: `${codeName(connectError.code)}: ${message}` };
  }
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
