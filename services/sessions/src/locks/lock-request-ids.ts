/**
 * Lock requests as their request ids name them (the service's rule for request ids,
 * @berth/shared/idempotency), for both stores: what makes a repeat the same request, and what the
 * first call answered.
 */
import type { KeyedRequest } from "@berth/shared/idempotency";
import type { Lease } from "./source-locks-api.js";

/** What a request id's call answered: an Acquire's lease, a Release's outcome. */
export type KeyedAnswer = { lease: Lease } | { released: boolean };

/** An Acquire as its request id names it: the fields that shape the lease (the wait does not). */
export function acquireRequest(file: string, owner: string, ttlMs: number): KeyedRequest {
  return { rpc: "Acquire", fingerprint: JSON.stringify([file, owner, ttlMs]), named: { file, owner } };
}

/** A Release as its request id names it: the lease (compared, never shown), and its file and fencing token when known. */
export function releaseRequest(leaseToken: string, named: { file?: string; fencingToken?: number }): KeyedRequest {
  return { rpc: "Release", fingerprint: leaseToken, named };
}

/** The request an Acquire's id now names: the lease it was granted, its fencing token shown to a reuse of the id. */
export function grantedRequest(keyed: KeyedRequest, lease: Lease): KeyedRequest {
  return { ...keyed, named: { ...keyed.named, fencingToken: lease.fencingToken } };
}
