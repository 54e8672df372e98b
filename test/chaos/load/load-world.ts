/**
 * The load suite's shared state: the clients, what has been acknowledged (so watchers can be
 * checked against it), who holds which file as the clients see it, the phase of the run, the
 * tally, and a seeded random source.
 */
import type { Client } from "@connectrpc/connect";
import type { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import type { GrpcJsClient } from "../../harness.js";
import type { Lanes } from "./load-lanes.js";
import type { LoadTally } from "./load-tally.js";

/** `load` while traffic runs; `drain` once it stops (no new stream opens, watchers finish catching up). */
export type LoadPhase = "load" | "drain";

/** A stream still open, for the report when the drain cannot finish it. */
export interface OpenStream {
  describe(): string;
  cancel(): void;
}

/** What every client loop of the load suite shares. */
export interface LoadWorld {
  phase: LoadPhase;
  readonly tally: LoadTally;
  readonly random: () => number;
  /** grpc-js clients of the sessions server (journal and lock RPCs); new ones each round. */
  sessionsGrpc: Lanes<GrpcJsClient>;
  /** connect-node Connect-JSON (HTTP/1.1) clients of the sessions server. */
  sessionsJson: Lanes<Client<typeof SessionService>>;
  /** connect-node gRPC clients of the budget server. */
  budget: Lanes<Client<typeof BudgetService>>;
  /** The sessions appended to, each by one appender only. */
  readonly sessions: readonly string[];
  /** Session → its last acknowledged seq. Entry `n` of every session is the event `agent_phase n<n>`. */
  readonly acked: Map<string, number>;
  /** Session → its last seq once appends have stopped (set when the drain begins). */
  final: ReadonlyMap<string, number> | undefined;
  /** The files Hold streams contend for. */
  readonly files: readonly string[];
  /** File → the owner holding it as the clients see it (from `acquired` to the client's cancel). */
  readonly holders: Map<string, string>;
  /** File → the highest fencing token a client has been granted. */
  readonly lastToken: Map<string, bigint>;
  /** Streams open now. */
  readonly open: Set<OpenStream>;
  /** The budget of the fixture machine, for GetState checks. */
  readonly budgetMemoryBytes: bigint;
  readonly budgetCpu: number;
}

/** One element of `items`, uniformly. */
export function pick<T>(random: () => number, items: readonly T[]): T {
  return items[Math.floor(random() * items.length)]!;
}

/** A whole number in [min, max]. */
export function between(random: () => number, min: number, max: number): number {
  return min + Math.floor(random() * (max - min + 1));
}

/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** The phase name of entry `seq` of every session of the run: what a watcher must see at that seq. */
export function phaseOf(seq: number): string {
  return `n${seq}`;
}
