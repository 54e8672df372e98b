/**
 * Signals for commands that wait for the service and then run CMD (`berth admit`, `berth lock
 * hold`): while waiting, a signal withdraws the request; once CMD runs, it is passed on to CMD.
 */
import type { ChildProcess } from "node:child_process";
import { constants } from "node:os";

/** The signal's conventional exit code (128 + its number). */
export function signalExit(signal: NodeJS.Signals): number {
  return 128 + (constants.signals[signal] ?? 0);
}

/** What `relaySignals` needs: the running CMD (once there is one) and how to withdraw the wait. */
export interface SignalRelay {
  /** The first signal that arrived while still waiting, if any: the command exits with `signalExit` of it. */
  readonly interrupted: NodeJS.Signals | undefined;
  /** CMD, once started: later signals go to it. */
  child: ChildProcess | undefined;
  /** Stops listening. */
  dispose(): void;
}

/**
 * Listens for SIGINT, SIGTERM and SIGHUP. Before CMD starts, the first one calls `withdraw` (ending
 * the stream drops the queued request) and is remembered; after, each is sent to CMD — except a
 * terminal's Ctrl-C, which reaches CMD already (same process group): sending it again would count
 * twice.
 */
export function relaySignals(withdraw: () => void): SignalRelay {
  const signals: NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP"];
  const relay = {
    interrupted: undefined as NodeJS.Signals | undefined,
    child: undefined as ChildProcess | undefined,
    dispose() {
      for (const signal of signals) process.off(signal, onSignal);
    },
  };
  function onSignal(signal: NodeJS.Signals) {
    if (relay.child === undefined) {
      relay.interrupted ??= signal;
      withdraw();
      return;
    }
    if (signal === "SIGINT" && process.stdin.isTTY) return;
    relay.child.kill(signal);
  }
  for (const signal of signals) process.on(signal, onSignal);
  return relay;
}
