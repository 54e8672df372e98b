/**
 * The processes the budget chaos suite reports as running work: `sleep` children of the test
 * process (so the test reaps them and a killed one is really gone, not a zombie that signal 0 still
 * reaches), each with what the suite knows about its running-tally entry. The suite's model of the
 * tally is built from these records: an entry must be counted while its process runs and nobody
 * stopped it, and must be gone once its process is.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { onStopAll } from "../../harness.js";

/** What the suite knows about a sleeper's running entry. */
export type Registration =
  /** Not reported to the budget (yet). */
  | "none"
  /** Reported; no answer yet. */
  | "pending"
  /** Reported and acknowledged: `entryId` names the entry. */
  | "confirmed"
  /** Reported and refused (the reservation's lease had lapsed): no entry. */
  | "refused"
  /** Reported on a stream that was cancelled before the answer: there may or may not be an entry. */
  | "uncertain";

/** One `sleep` child and its running entry. */
export interface Sleeper {
  readonly pid: number;
  readonly child: ChildProcess;
  /** Resolves once the child has exited and been reaped. */
  readonly exited: Promise<void>;
  hasExited: boolean;
  registration: Registration;
  entryId?: string | undefined;
  /** When the registration was acknowledged (performance.now()). */
  confirmedAt?: number | undefined;
  /** The entry has a lease: it may end on its own, so its absence proves nothing. */
  leased: boolean;
  /** The suite let go of it (StopRunning sent or the process being killed): its absence is allowed. */
  letGo: boolean;
  /** StopRunning acknowledged it. */
  stopped: boolean;
  /** What the entry counts. */
  memoryBytes: number;
  cpu: number;
}

/** Every sleeper the suite started. */
export class Sleepers {
  readonly all: Sleeper[] = [];
  private readonly byEntry = new Map<string, Sleeper>();

  constructor() {
    onStopAll(() => this.killAll());
  }

  /** Starts a `sleep` that lasts longer than any run of the suite (the suite kills it). */
  start(memoryBytes: number, cpu: number): Sleeper {
    const child = spawn("sleep", ["600"], { stdio: "ignore" });
    if (child.pid === undefined) throw new Error("could not start sleep");
    let resolveExit!: () => void;
    const exited = new Promise<void>((resolve) => (resolveExit = resolve));
    const sleeper: Sleeper = {
      pid: child.pid,
      child,
      exited,
      hasExited: false,
      registration: "none",
      leased: false,
      letGo: false,
      stopped: false,
      memoryBytes,
      cpu,
    };
    child.once("exit", () => {
      sleeper.hasExited = true;
      resolveExit();
    });
    this.all.push(sleeper);
    return sleeper;
  }

  /** Records an acknowledged registration. */
  confirm(sleeper: Sleeper, entryId: string, leased: boolean): void {
    sleeper.registration = "confirmed";
    sleeper.entryId = entryId;
    sleeper.leased = leased;
    sleeper.confirmedAt = performance.now();
    this.byEntry.set(entryId, sleeper);
  }

  /** The sleeper a running entry belongs to, if it is one whose registration was acknowledged. */
  ofEntry(entryId: string): Sleeper | undefined {
    return this.byEntry.get(entryId);
  }

  /** Kills a sleeper (SIGKILL) and waits until it is reaped. */
  async kill(sleeper: Sleeper): Promise<void> {
    sleeper.letGo = true;
    if (!sleeper.hasExited) sleeper.child.kill("SIGKILL");
    await sleeper.exited;
  }

  /** Entries that must be in the tally now: acknowledged, without a lease, never let go, still running. */
  mustBeCounted(acknowledgedBefore: number): Sleeper[] {
    return this.all.filter((s) => s.registration === "confirmed" && !s.leased && !s.letGo && !s.hasExited && s.confirmedAt! < acknowledgedBefore);
  }

  /** How many are still running. */
  get running(): number {
    return this.all.filter((s) => !s.hasExited).length;
  }

  private killAll(): void {
    for (const s of this.all) if (!s.hasExited) s.child.kill("SIGKILL");
  }
}
