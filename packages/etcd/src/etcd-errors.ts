/**
 * etcd's failures as berth's errors, mapped in one place. etcd answers with a gRPC code and a fixed
 * message per case (`etcdserver: …`, its rpctypes); the message, not the code alone, tells the
 * cases apart (request too large and too many txn ops are both INVALID_ARGUMENT).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { ANY_CALL_REASONS, LOCKS_REASONS, SESSIONS_REASONS, UNSENT_REASONS } from "@berth/wire/reasons";
import { descriptorShortageIn } from "@berth/shared/descriptors";
import { BerthError } from "@berth/shared/errors";
import { descriptorRefusal } from "@berth/shared/state-errors";

/** The reasons (`ErrorInfo.reason`) of the errors this package throws, by etcd's case (the wire's tables hold them). */
export const EtcdReason = {
  /** No member answered, none has a leader, or the request timed out: retry later. */
  UNAVAILABLE: ANY_CALL_REASONS.ETCD_UNAVAILABLE,
  /** The request is over etcd's `--max-request-bytes` (or gRPC's limit just above it). */
  REQUEST_TOO_LARGE: SESSIONS_REASONS.REQUEST_TOO_LARGE,
  /** A transaction with more operations than etcd's `--max-txn-ops`. */
  TOO_MANY_OPS: SESSIONS_REASONS.ETCD_TOO_MANY_TXN_OPS,
  /** etcd's storage quota alarm (NOSPACE): it refuses every write until an operator acts. */
  NO_SPACE: SESSIONS_REASONS.ETCD_NO_SPACE,
  /** The revision asked for was compacted away (see {@link EtcdCompactedError}). */
  COMPACTED: UNSENT_REASONS.ETCD_COMPACTED,
  /** The lease expired or was revoked (see {@link EtcdLeaseLostError}). */
  LEASE_LOST: LOCKS_REASONS.ETCD_LEASE_LOST,
  /** etcd refused berth's credentials or their rights: the operator must fix the configuration. */
  AUTH: ANY_CALL_REASONS.ETCD_AUTH,
  /** Anything else etcd answered: a bug on one side or the other. */
  ERROR: ANY_CALL_REASONS.ETCD_ERROR,
} as const;

/** Whether a failed write may nevertheless have been applied. */
export type EtcdOutcome = "not_applied" | "unknown";

/**
 * A read or watch asked for a revision etcd has compacted. Distinct so that a watcher can end as
 * lagged (its caller resumes from what it has) rather than fail: `compactRevision` is the oldest
 * revision etcd still has.
 */
export class EtcdCompactedError extends BerthError {
  override name = "EtcdCompactedError";
  constructor(
    /** The revision asked for. */
    readonly requestedRevision: bigint,
    /** The oldest revision etcd still has, when it said (a watch does; a range does not). */
    readonly compactRevision: bigint | undefined,
  ) {
    const kept = compactRevision === undefined ? "" : ` (it keeps revisions from ${compactRevision} on)`;
    super(
      "resource_exhausted",
      `etcd has compacted revision ${requestedRevision} away${kept}: read the current state and follow from there`,
      { requestedRevision: String(requestedRevision), ...(compactRevision === undefined ? {} : { compactRevision: String(compactRevision) }) },
      { reason: EtcdReason.COMPACTED },
    );
  }
}

/** True for {@link EtcdCompactedError}. */
export function isEtcdCompacted(error: unknown): error is EtcdCompactedError {
  return error instanceof EtcdCompactedError;
}

/** A lease is gone: it expired (no keepalive got through within its TTL) or was revoked. */
export class EtcdLeaseLostError extends BerthError {
  override name = "EtcdLeaseLostError";
  constructor(
    readonly leaseId: bigint,
    why: string,
  ) {
    super("aborted", `etcd lease ${leaseId.toString(16)} is lost: ${why}`, { leaseId: leaseId.toString(16) }, { reason: EtcdReason.LEASE_LOST });
  }
}

/** What the mapping needs to know about the call that failed. */
export interface EtcdCallContext {
  /** The operation, for the message (`txn`, `range`, `watch`…). */
  readonly op: string;
  /** The member the call went to. */
  readonly endpoint: string;
  /** True for calls that change etcd (put, delete, txn with writes, lease grant): their outcome matters. */
  readonly write: boolean;
  /** The encoded request's size (computed only for the too-large message). */
  readonly requestBytes?: () => number;
  /** The revision a read asked for, when it named one: named in the compacted error. */
  readonly revision?: bigint;
}

/** How long a caller should wait before retrying an unavailable etcd. */
const RETRY_AFTER_MS = 1_000;

/**
 * The BerthError for anything a call to etcd threw. BerthErrors pass through unchanged (the
 * client's own, e.g. a lost lease).
 */
export function toBerthError(error: unknown, call: EtcdCallContext): BerthError {
  if (error instanceof BerthError) return error;
  const connect = ConnectError.from(error);
  const message = connect.rawMessage;
  const where = `etcd ${call.op} at ${call.endpoint}`;
  // No descriptor left for a connection to etcd: the service's own limit, not etcd's; the request
  // was never sent. connect-node reports it as INTERNAL.
  const noDescriptor = descriptorShortageIn(connect);
  if (noDescriptor !== undefined) {
    return (
      descriptorRefusal(noDescriptor, `${where}: no connection to etcd could be opened`, { endpoint: call.endpoint, outcome: "not_applied" }) ??
      etcdError(where, connect)
    );
  }
  // The connection broke under the call (the member was killed, a proxy reset it): connect-node
  // reports these as ABORTED or INTERNAL, but the cluster may be fine; another member can answer.
  if (connectionLost(connect)) return unavailable(where, message, call, "unknown");
  switch (connect.code) {
    // The member is down, has no leader, is stopping, or timed out waiting for the cluster. A
    // request refused before it was sent was not applied; one that timed out may have been.
    case Code.Unavailable:
    case Code.DeadlineExceeded:
    case Code.Canceled:
      return unavailable(where, message, call, notApplied(connect) ? "not_applied" : "unknown");
    case Code.ResourceExhausted:
      if (message.includes("database space exceeded")) return noSpace(where);
      // gRPC's own limit (etcd's --max-request-bytes plus 512 KiB), hit before etcd reads the request.
      if (/message larger than max/.test(message)) return tooLarge(call, message);
      // "too many requests": etcd's apply lags its commits by thousands of entries; not applied.
      return unavailable(where, message, call, "not_applied");
    case Code.InvalidArgument:
      if (message.includes("request is too large")) return tooLarge(call, message);
      if (message.includes("too many operations in txn request")) {
        return new BerthError(
          "invalid_argument",
          `${where}: the transaction has more operations than etcd's --max-txn-ops (128 unless the operator changed it)`,
          { etcd: message },
          { reason: EtcdReason.TOO_MANY_OPS },
        );
      }
      // Wrong credentials; and no credentials at all once etcd has auth enabled ("user name is empty").
      if (message.includes("authentication failed") || message.includes("user name is empty")) return auth(where, message);
      return etcdError(where, connect);
    case Code.Unauthenticated:
    case Code.PermissionDenied:
      return auth(where, message);
    case Code.NotFound:
      if (message.includes("requested lease not found"))
        return new BerthError("aborted", `${where}: the lease is not found (expired or revoked)`, { etcd: message }, { reason: EtcdReason.LEASE_LOST });
      return etcdError(where, connect);
    case Code.OutOfRange:
      if (message.includes("required revision has been compacted")) return new EtcdCompactedError(call.revision ?? 0n, undefined);
      return etcdError(where, connect);
    default:
      return etcdError(where, connect);
  }
}

function unavailable(where: string, message: string, call: EtcdCallContext, outcome: EtcdOutcome): BerthError {
  const unknown = call.write && outcome === "unknown";
  return new BerthError(
    "unavailable",
    `${where} is unavailable (${message})${unknown ? "; the write may or may not have been applied" : ""}; retry later`,
    { endpoint: call.endpoint, etcd: message, outcome: call.write ? outcome : "not_applied" },
    { reason: EtcdReason.UNAVAILABLE, retryAfterMs: RETRY_AFTER_MS },
  );
}

function tooLarge(call: EtcdCallContext, message: string): BerthError {
  const bytes = call.requestBytes?.();
  const size = bytes === undefined ? "the request" : `the request (${bytes} bytes)`;
  return new BerthError(
    "invalid_argument",
    `${size} is over etcd's request size limit (--max-request-bytes, 1.5 MiB unless the operator changed it): send less at once`,
    { etcd: message, ...(bytes === undefined ? {} : { requestBytes: bytes }) },
    { reason: EtcdReason.REQUEST_TOO_LARGE },
  );
}

function noSpace(where: string): BerthError {
  return new BerthError(
    "resource_exhausted",
    `${where}: etcd's storage is full (its NOSPACE alarm is raised) and it refuses every write. ` +
      "An operator must free space: compact etcd's history (etcdctl compact), defragment (etcdctl defrag), " +
      "or raise --quota-backend-bytes, then clear the alarm (etcdctl alarm disarm)",
    { alarm: "NOSPACE" },
    { reason: EtcdReason.NO_SPACE },
  );
}

function auth(where: string, message: string): BerthError {
  return new BerthError(
    "internal",
    `${where} refused berth's credentials or their rights (${message}): check the etcd user, password and roles berth is given`,
    { etcd: message },
    { reason: EtcdReason.AUTH },
  );
}

function etcdError(where: string, error: ConnectError): BerthError {
  return new BerthError(
    "internal",
    `${where} failed: ${error.rawMessage}`,
    { etcd: error.rawMessage, grpcCode: Code[error.code] },
    { reason: EtcdReason.ERROR },
  );
}

/** Socket and HTTP/2 errors of a connection that broke while a call was on it. */
const CONNECTION_LOST = new Set([
  "ECONNRESET",
  "EPIPE",
  "ECONNABORTED",
  "ETIMEDOUT",
  "ERR_HTTP2_GOAWAY_SESSION",
  "ERR_HTTP2_INVALID_SESSION",
  "ERR_HTTP2_SESSION_ERROR",
  "ERR_HTTP2_STREAM_CANCEL",
  "ERR_HTTP2_STREAM_ERROR",
]);

/** True when the call failed because its connection broke, whatever code connect-node gave it. */
function connectionLost(error: ConnectError): boolean {
  // connect-node makes ECONNRESET ABORTED (as for a client hanging up on a server) and most others INTERNAL.
  if (error.code !== Code.Internal && error.code !== Code.Unknown && error.code !== Code.Aborted) return false;
  if (/\b(ECONNRESET|EPIPE|ECONNABORTED)\b/.test(error.rawMessage)) return true;
  let cause: unknown = error.cause;
  for (let depth = 0; cause && depth < 4; depth++) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === "string" && CONNECTION_LOST.has(code)) return true;
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * True when the request certainly never reached etcd: the connection was refused or reset before
 * the call was written, or etcd said it has no leader (checked before anything is proposed).
 */
function notApplied(error: ConnectError): boolean {
  if (error.rawMessage.includes("etcdserver: no leader") || error.rawMessage.includes("etcdserver: not capable")) return true;
  let cause: unknown = error.cause;
  for (let depth = 0; cause && depth < 4; depth++) {
    const code = (cause as { code?: unknown }).code;
    if (code === "ECONNREFUSED" || code === "EHOSTUNREACH" || code === "ENETUNREACH") return true;
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}
