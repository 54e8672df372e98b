/**
 * The budget's requests as their request ids name them (the rule of @berth/shared/idempotency):
 * for each keyed call, the fields that shape what it makes, written canonically, and what the id is
 * said to name in a refusal. The wait (`max_wait`, the deadline) is never part of a request.
 */
import type { KeyedRequest } from "@berth/shared/idempotency";
import type { Need, NeedItem, Resources } from "./costs.js";
import type { ReservationSnapshot } from "./reservations.js";
import type { RunningEntry } from "./running-tally.js";

/** What RegisterRunning (or Admit's `started`) answers: the entry, and the reservation it left, as they stood then. */
export interface RunningAnswer {
  running: RunningEntry;
  reservation?: ReservationSnapshot | undefined;
}

/** The first answer of a keyed call of the budget. */
export type BudgetAnswer =
  /** Reserve, Admit's start, ReleaseBuild. */
  | { reservation: ReservationSnapshot; running?: undefined }
  /** RegisterRunning, Admit's `started`. */
  | RunningAnswer
  /** Release. */
  | { released: boolean }
  /** StopRunning. */
  | { stopped: boolean };

/** A need as costed (a spec and its bytes are the same need): the shares and every item. */
function needKey(need: Pick<Need, "start" | "build"> & { readonly items?: readonly NeedItem[] | undefined }): unknown[] {
  const items = (need.items ?? []).map((item) => [item.kind, item.name, item.cost.memoryBytes, item.cost.cpu, item.wave ?? null, item.skipped ?? null]);
  return [need.start.memoryBytes, need.start.cpu, need.build.memoryBytes, need.build.cpu, items];
}

/** Reserve: the need, the owner, the lease's ttl, skip_load_gate. */
export function reserveRequest(need: Pick<Need, "start" | "build">, owner: string, ttlMs: number, skipLoadGate: boolean): KeyedRequest {
  return { rpc: "Reserve", fingerprint: JSON.stringify([needKey(need), owner, ttlMs, skipLoadGate]), named: { owner } };
}

/** Admit's start: the need, the owner, skip_load_gate. */
export function admitRequest(need: Pick<Need, "start" | "build">, owner: string, skipLoadGate: boolean): KeyedRequest {
  return { rpc: "Admit", fingerprint: JSON.stringify([needKey(need), owner, skipLoadGate]), named: { owner } };
}

/**
 * RegisterRunning (and Admit's `started`, the same request with the stream's reservation): name, the
 * cost as declared (what was left to a default is compared as undeclared), pid, ttl, reservation.
 */
export function runningRequest(
  name: string,
  declaredCost: Partial<Resources>,
  pid: number | undefined,
  ttlMs: number | undefined,
  reservationId: string | undefined,
): KeyedRequest {
  return {
    rpc: "RegisterRunning",
    fingerprint: JSON.stringify([name, declaredCost.memoryBytes ?? null, declaredCost.cpu ?? null, pid ?? null, ttlMs ?? null, reservationId ?? null]),
    named: reservationId === undefined ? { name } : { name, reservationId },
  };
}

/** The same request a running entry was counted by (its fields are what was asked). */
export function runningRequestOf(entry: RunningEntry): KeyedRequest {
  return runningRequest(entry.name, entry.cost, entry.pid, entry.leaseTtlMs, entry.reservationId);
}

/** Release, ReleaseBuild: the reservation. */
export function reservationRequest(rpc: "Release" | "ReleaseBuild", reservationId: string): KeyedRequest {
  return { rpc, fingerprint: reservationId, named: { reservationId } };
}

/** StopRunning: the running entry. */
export function stopRequest(runningId: string): KeyedRequest {
  return { rpc: "StopRunning", fingerprint: runningId, named: { runningId } };
}

/** `request` naming more now that what it made is known. */
export function naming(request: KeyedRequest, more: Record<string, string | number | undefined>): KeyedRequest {
  const named: Record<string, string | number> = { ...request.named };
  for (const [name, value] of Object.entries(more)) if (value !== undefined) named[name] = value;
  return { ...request, named };
}
