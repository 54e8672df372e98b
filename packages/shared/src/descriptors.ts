/**
 * A process's file descriptors: how many it may have open (RLIMIT_NOFILE), how a service shares
 * them out, and what it does when none is left.
 *
 * Every connection, journal, lock file and snapshot write takes one, and they all come from the
 * same per-process limit (`ulimit -n`): the kernel refuses the next open with EMFILE (ENFILE when
 * the whole system is out) whoever asked. So the service shares the limit out at start: most to
 * client connections, a few spare connections to answer (health checks, refusals) when those are
 * taken, a bounded number of journals kept open, and the rest to its own descriptors and to the
 * files it opens for a moment (a read, a lock file, a snapshot write). And whoever meets EMFILE
 * anyway asks every holder of idle descriptors to close them ({@link relieveDescriptorShortage}),
 * so that a retry succeeds.
 */
import * as fs from "node:fs";
import { errnoCode } from "./state-errors.js";

/** True for the errors of an open (or accept) refused for want of a descriptor: EMFILE (this process's limit), ENFILE (the system's). */
export function isDescriptorExhaustion(error: unknown): boolean {
  const code = errnoCode(error);
  return code === "EMFILE" || code === "ENFILE";
}

/**
 * The EMFILE or ENFILE `error` is, or was caused by (a client library wraps the socket's error:
 * connect-node calls a connection refused a descriptor INTERNAL); undefined for any other error.
 */
export function descriptorShortageIn(error: unknown): unknown {
  let cause: unknown = error;
  for (let depth = 0; cause instanceof Error && depth < 5; depth++) {
    if (isDescriptorExhaustion(cause)) return cause;
    cause = cause.cause;
  }
  return undefined;
}

/**
 * The process's limit on open descriptors: the soft RLIMIT_NOFILE (which Node raises to the hard
 * one at start), read from /proc since Node has no call for it; undefined where it cannot be read
 * or is unlimited.
 */
export function descriptorLimit(limitsFile = "/proc/self/limits"): number | undefined {
  try {
    const line = fs
      .readFileSync(limitsFile, "utf8")
      .split("\n")
      .find((l) => l.startsWith("Max open files"));
    const soft = line?.slice("Max open files".length).trim().split(/\s+/)[0];
    return soft !== undefined && /^\d+$/.test(soft) ? Number(soft) : undefined;
  } catch {
    return undefined;
  }
}

/** The share of the descriptor limit that client connections may take, all listeners together. */
export const CONNECTION_SHARE = 0.75;
/** The share kept for spare connections (answered and closed at once when the others are taken): at least {@link MIN_SPARE_CONNECTIONS}, at most {@link MAX_SPARE_CONNECTIONS}. */
export const SPARE_CONNECTION_SHARE = 0.02;
export const MIN_SPARE_CONNECTIONS = 2;
export const MAX_SPARE_CONNECTIONS = 32;
/**
 * Descriptors a Node service holds of its own and takes for a moment: stdio, the event loop's,
 * libuv's thread pool and its reserve, the journal scan worker, the directory watch, the election
 * lock, and the files opened for one call (27 measured at rest on Linux, Node 20).
 */
export const PROCESS_RESERVE = 32;
/** Journals kept open are never fewer than this, however low the limit. */
export const MIN_OPEN_JOURNALS = 4;

/** How a service shares its descriptor limit out; see the module comment. */
export interface DescriptorShares {
  /** The limit it was computed from; undefined when it could not be read (nothing is bounded then). */
  readonly limit: number | undefined;
  /** Client connections kept open together, all listeners of the process together. */
  readonly connections: number;
  /** Connections accepted over `connections`, each answered and closed at once (health is answered; every other call refused TOO_MANY_OPEN_FILES). */
  readonly spareConnections: number;
  /** Journals kept open (for appending) by a file journal store. */
  readonly journals: number;
}

/**
 * The shares of `limit`: connections {@link CONNECTION_SHARE} of it, spare connections
 * {@link SPARE_CONNECTION_SHARE}, and journals half of what is left once those and
 * {@link PROCESS_RESERVE} are taken (the other half is for files opened for a moment); unbounded
 * when the limit is unknown. At 256: 192 connections, 5 spare, 13 journals; at 1,024: 768, 20 and
 * 102; at 65,536: 49,152, 32 and 8,160.
 */
export function descriptorShares(limit: number | undefined): DescriptorShares {
  if (limit === undefined) return { limit, connections: Infinity, spareConnections: MAX_SPARE_CONNECTIONS, journals: Infinity };
  const connections = Math.max(8, Math.floor(limit * CONNECTION_SHARE));
  const spareConnections = Math.min(MAX_SPARE_CONNECTIONS, Math.max(MIN_SPARE_CONNECTIONS, Math.floor(limit * SPARE_CONNECTION_SHARE)));
  const journals = Math.max(MIN_OPEN_JOURNALS, Math.floor((limit - connections - spareConnections - PROCESS_RESERVE) / 2));
  return { limit, connections, spareConnections, journals };
}

/** Closes idle descriptors when asked; returns how many it closed. */
export type DescriptorRelief = () => number;

/**
 * Who holds descriptors it could close (a journal store's idle journals). Process-wide, as the
 * limit is: the code that meets EMFILE (an accept, a lock file, a refusal on its way to a client)
 * knows nothing of who holds what.
 */
const reliefs = new Set<DescriptorRelief>();

/** Registers `relief`, asked to close its idle descriptors whenever one is refused; returns the unregister function. */
export function onDescriptorShortage(relief: DescriptorRelief): () => void {
  reliefs.add(relief);
  return () => void reliefs.delete(relief);
}

/**
 * No descriptor was left for something: every registered holder closes what it holds idle, so
 * that the next open — the caller's retry — finds one. Returns how many were closed.
 */
export function relieveDescriptorShortage(): number {
  let closed = 0;
  for (const relief of [...reliefs]) closed += relief();
  return closed;
}

/**
 * Runs `open` (work that opens descriptors); when it fails for want of one, relieves the shortage
 * and runs it once more, so that the idle descriptors closed serve this call, not only the next.
 * `open` must be safe to run again after failing so (it changed nothing before its open failed).
 */
export function retryAfterRelief<T>(open: () => T): T {
  try {
    return open();
  } catch (error) {
    if (!isDescriptorExhaustion(error)) throw error;
    relieveDescriptorShortage();
    return open();
  }
}
