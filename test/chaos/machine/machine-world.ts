/**
 * What the machine suite's scenarios share (`machine.test.ts`): the findings they add to, bounded
 * waits, the state of a process, and clients each on a connection of its own, so that one of them
 * can leave (its connection closed, as a killed process's is) without the others.
 */
import { readdirSync, readlinkSync } from "node:fs";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import type { Client } from "@connectrpc/connect";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { closeClient, connectClient, type ConnectClientOptions, type LogEntry } from "../../harness.js";

/** What the scenarios found: broken promises, and what they did. */
export class Findings {
  readonly violations: string[] = [];
  readonly figures: Record<string, unknown> = {};
  rounds = 0;
  operations = 0;

  /** Records a broken promise (the suite fails on any). */
  violation(scenario: string, what: string): void {
    this.violations.push(`${scenario}: ${what}`);
  }

  /** Records `what` as a violation unless `ok`. */
  check(ok: boolean, scenario: string, what: string): void {
    if (!ok) this.violation(scenario, what);
  }

  /** Adds what another tally found (a scenario's own, run beside others) to this one. */
  absorb(other: Findings): void {
    this.violations.push(...other.violations);
    Object.assign(this.figures, other.figures);
    this.rounds += other.rounds;
    this.operations += other.operations;
  }
}

/** JSON for messages, bigints as strings. */
export function show(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => (typeof v === "bigint" ? String(v) : v));
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `probe` until it answers true; false once `timeoutMs` has passed (every wait is bounded). */
export async function until(probe: () => boolean | Promise<boolean>, timeoutMs: number, everyMs = 20): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (await probe()) return true;
    if (performance.now() > deadline) return false;
    await sleep(everyMs);
  }
}

/** `promise`'s outcome, or `{ timedOut: true }` after `ms`. */
export async function within<T>(promise: Promise<T>, ms: number): Promise<{ value: T } | { error: unknown } | { timedOut: true }> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<{ timedOut: true }>((resolve) => (timer = setTimeout(() => resolve({ timedOut: true }), ms)));
  try {
    return await Promise.race([
      promise.then(
        (value) => ({ value }),
        (error: unknown) => ({ error }),
      ),
      timeout,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** How many descriptors process `pid` has open (/proc/PID/fd), leaving out those `except` says of their target. */
export function openDescriptors(pid: number, except: (target: string) => boolean = () => false): number {
  let count = 0;
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    let target: string;
    try {
      target = readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      continue; // closed while we looked
    }
    if (!except(target)) count++;
  }
  return count;
}

/** Clients of the sessions service's two services on one connection of their own. */
export interface SessionsClient {
  readonly locks: Client<typeof LockService>;
  readonly sessions: Client<typeof SessionService>;
  /** Closes the connection, as the kernel does when a client process dies. */
  leave(): void;
}

/** How a client talks to the service: gRPC unless given (Connect or gRPC-Web, on HTTP/1.1 or HTTP/2). */
export type ClientProtocol = Pick<ConnectClientOptions, "protocol" | "httpVersion" | "useBinaryFormat">;

export function sessionsClient(url: string, protocol: ClientProtocol = { protocol: "grpc" }): SessionsClient {
  const locks = connectClient(LockService, url, { ...protocol, defaultTimeoutMs: 180_000 });
  const sessions = connectClient(SessionService, url, { ...protocol, defaultTimeoutMs: 180_000 });
  return {
    locks,
    sessions,
    leave() {
      closeClient(locks);
      closeClient(sessions);
    },
  };
}

/** A budget client on a connection of its own. */
export interface BudgetClient {
  readonly budget: Client<typeof BudgetService>;
  leave(): void;
}

export function budgetClient(url: string, protocol: ClientProtocol = { protocol: "grpc" }): BudgetClient {
  const budget = connectClient(BudgetService, url, { ...protocol, defaultTimeoutMs: 180_000 });
  return { budget, leave: () => closeClient(budget) };
}

export const ms = (value: number) => durationFromMs(value);

/** The lock events of a sessions service's log (at debug): grants and ends, in the order logged. */
export interface LockEvent {
  readonly kind: "granted" | "released" | "expired" | "closed";
  readonly file: string;
  readonly owner: string;
  readonly token: number;
}

export function lockEvents(entries: readonly LogEntry[]): LockEvent[] {
  const events: LockEvent[] = [];
  for (const entry of entries) {
    const match = /^lock (granted|released|expired|closed)$/.exec(String(entry.msg ?? ""));
    if (!match || typeof entry.file !== "string") continue;
    events.push({ kind: match[1] as LockEvent["kind"], file: entry.file, owner: String(entry.owner), token: Number(entry.fencingToken) });
  }
  return events;
}

/**
 * Broken promises in a lock log: a grant while the file was held (two holders), a lease that ended
 * twice or without having been granted, and (for `gone`) a grant to an owner whose client had left.
 */
export function judgeLockEvents(events: readonly LockEvent[], gone: ReadonlySet<string> = new Set()): string[] {
  const problems: string[] = [];
  const holder = new Map<string, LockEvent>();
  const ended = new Set<string>();
  for (const event of events) {
    const key = `${event.file}#${event.token}`;
    if (event.kind === "granted") {
      const current = holder.get(event.file);
      if (current) problems.push(`${event.file} granted to ${event.owner} (token ${event.token}) while ${current.owner} (token ${current.token}) held it`);
      if (gone.has(event.owner)) problems.push(`${event.file} granted to ${event.owner}, whose client had left`);
      holder.set(event.file, event);
    } else {
      if (ended.has(key)) problems.push(`the lease of ${event.owner} (token ${event.token}) on ${event.file} ended twice`);
      ended.add(key);
      const current = holder.get(event.file);
      if (current?.token !== event.token) problems.push(`the lease of ${event.owner} (token ${event.token}) on ${event.file} ended without holding it`);
      else holder.delete(event.file);
    }
  }
  return problems;
}
