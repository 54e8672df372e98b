/** The refusals of an append to etcd that the file store has no need of: a lost fence, and a request too large for etcd. */
import { BerthError } from "@berth/shared/errors";
import { EtcdReason } from "@berth/etcd";
import type { EtcdFence } from "./etcd-journal-api.js";

/** Room left in a request for everything but the entries' lines (keys, head, idempotency record, compares). */
export const REQUEST_OVERHEAD_BYTES = 4 * 1024;

/** A fence whose token no longer holds the lock: etcd refused the write with it. */
export function fenceRejected(fence: Pick<EtcdFence, "file" | "token">, currentToken: bigint): BerthError {
  const now = currentToken === 0n ? "nobody holds it now" : `it is held with fencing token ${currentToken} now`;
  return new BerthError(
    "failed_precondition",
    `fence: fencing token ${fence.token} no longer holds the lock of ${fence.file} (${now}); nothing was written`,
    { file: fence.file, fencingToken: String(fence.token), currentToken: Number(currentToken) },
    { reason: "FENCE_REJECTED" },
  );
}

export function appendTooLarge(sessionId: string, bytes: number, limit: number): BerthError {
  return new BerthError(
    "invalid_argument",
    `events: the append to session ${sessionId} is ${bytes} bytes as journal lines, over what one etcd request carries (etcd's --max-request-bytes, ${limit} bytes by --etcd-max-request-bytes, less room for the head): split the append`,
    {
      field: "events",
      rule: `at most ${limit - REQUEST_OVERHEAD_BYTES} bytes per append (etcd's --max-request-bytes, less room for the head)`,
      limit: limit - REQUEST_OVERHEAD_BYTES,
      size: bytes,
    },
    { reason: EtcdReason.REQUEST_TOO_LARGE },
  );
}

/** etcd refused an append's size that berth's check let through: its `--max-request-bytes` is lower than berth was told. */
export function appendRefusedByEtcd(sessionId: string, bytes: number, told: number, refusal: BerthError): BerthError {
  return new BerthError(
    "invalid_argument",
    `events: etcd refused the append to session ${sessionId} (${bytes} bytes as journal lines) as larger than one request may be: its --max-request-bytes is below the ${told} bytes berth was told (--etcd-max-request-bytes). Split the append, and give berth etcd's limit`,
    {
      field: "events",
      rule: `at most etcd's --max-request-bytes, less room for the head (below the ${told} bytes of --etcd-max-request-bytes)`,
      size: bytes,
      ...(typeof refusal.details?.etcd === "string" ? { etcd: refusal.details.etcd } : {}),
    },
    { reason: EtcdReason.REQUEST_TOO_LARGE },
  );
}
