/**
 * The lock chaos suite's verdict, computed after the run from what the service's journals hold and
 * what the clients logged. Nothing here looks at a clock: exclusion is judged by the order of the
 * protected writes in each file's journal, the order of a process's own log lines, and the bytes a
 * paused client had logged at the moment it was stopped.
 */
import type { LoggedRecord, ProtectedWrite } from "./lock-records.js";

/** One accepted protected write, as the journal of its file's session holds it. */
export interface JournalWrite extends ProtectedWrite {
  readonly seq: number;
}

/** A holder the suite paused with SIGSTOP until its fencing token was no longer current. */
export interface PauseRecord {
  readonly client: number;
  readonly pid: number;
  readonly file: string;
  readonly fencingToken: number;
  /** Size of the client's log once the process was stopped: every later line was written after SIGCONT. */
  readonly logOffset: number;
}

/** What the checks are given. */
export interface LockRunEvidence {
  readonly files: readonly string[];
  /** Each file's accepted protected writes in journal (seq) order. */
  readonly journals: ReadonlyMap<string, readonly JournalWrite[]>;
  /** Each client slot's log, in file order. */
  readonly logs: ReadonlyMap<number, readonly LoggedRecord[]>;
  /** Log lines that did not parse. */
  readonly badLogLines: number;
  readonly pauses: readonly PauseRecord[];
  /** Each file's last fencing token as the service reports it at the end (Inspect). */
  readonly lastTokens: ReadonlyMap<string, number>;
}

/** The verdict: every broken promise as a sentence, and the figures of the run. */
export interface LockRunVerdict {
  readonly violations: string[];
  readonly grants: number;
  readonly grantsByMode: { hold: number; lease: number };
  readonly writesAttempted: number;
  readonly writesAccepted: number;
  readonly requests: number;
  /** Attempts by resumed holders with the fence they held before the pause. */
  readonly staleAttempts: number;
  /** Of those, refused with FAILED_PRECONDITION FENCE_REJECTED and a FenceRejected detail naming the stale token. */
  readonly staleFencesRefused: number;
  /** Pauses that landed before the holder's last write (so it tried to write with a stale fence). */
  readonly pausesMidHold: number;
  /**
   * Writes of paused holders that were on their way when the holder stopped (attempt logged before,
   * outcome after): either answer is right, depending on whether the request left before the stop.
   */
  readonly inFlightAtPause: { accepted: number; refused: number };
  /** Refusals of holders that were not paused (a lease lost under load): allowed, reported. */
  readonly otherRefusals: number;
  /** Handoff latency samples (ms): a release to the grant of a client that was already waiting. */
  readonly handoffsMs: number[];
}

const writeKey = (pid: number, file: string, token: number, n: number) => `${pid}|${file}|${token}|${n}`;
const grantKey = (pid: number, file: string, token: number) => `${pid}|${file}|${token}`;

/** Judges a run; `violations` is empty when every promise held. */
export function judgeLockRun(evidence: LockRunEvidence): LockRunVerdict {
  const violations: string[] = [];
  const violation = (message: string) => {
    if (violations.length < 1000) violations.push(message);
  };
  if (evidence.badLogLines > 0) violation(`${evidence.badLogLines} client log lines do not parse`);

  // ---- the logs: grants, attempts and outcomes.
  const grantsByFile = new Map<string, Map<number, { pid: number; client: number }>>();
  const grantsOf = new Map<string, LoggedRecord & { event: "granted" }>();
  const attempts = new Set<string>();
  const outcomes = new Map<string, LoggedRecord>();
  const releasing = new Map<string, LoggedRecord & { event: "releasing" }>();
  const askedBefore = new Map<string, LoggedRecord & { event: "asked" }>();
  let grants = 0;
  const grantsByMode = { hold: 0, lease: 0 };
  let writesAttempted = 0;
  let requests = 0;
  for (const [client, records] of evidence.logs) {
    const lastAsked = new Map<number, LoggedRecord & { event: "asked" }>();
    const lastTokenOf = new Map<string, number>();
    for (const record of records) {
      if (record.client !== client) violation(`client ${client}'s log holds a record of client ${record.client}`);
      switch (record.event) {
        case "asked":
          requests++;
          lastAsked.set(record.pid, record);
          break;
        case "granted": {
          grants++;
          grantsByMode[record.mode]++;
          const byToken = grantsByFile.get(record.file) ?? new Map<number, { pid: number; client: number }>();
          grantsByFile.set(record.file, byToken);
          const earlier = byToken.get(record.fencingToken);
          if (earlier)
            violation(
              `${record.file}: fencing token ${record.fencingToken} granted twice (client ${earlier.client} pid ${earlier.pid}, client ${client} pid ${record.pid})`,
            );
          byToken.set(record.fencingToken, { pid: record.pid, client });
          const key = grantKey(record.pid, record.file, record.fencingToken);
          grantsOf.set(key, record);
          const asked = lastAsked.get(record.pid);
          if (asked) askedBefore.set(key, asked);
          // One process's own grants on one file come one after another: its tokens must rise.
          const ownKey = `${record.pid}|${record.file}`;
          const previous = lastTokenOf.get(ownKey);
          if (previous !== undefined && record.fencingToken <= previous) {
            violation(`${record.file}: pid ${record.pid} was granted token ${record.fencingToken} after token ${previous}`);
          }
          lastTokenOf.set(ownKey, record.fencingToken);
          break;
        }
        case "write-attempt":
          writesAttempted++;
          requests++;
          attempts.add(writeKey(record.pid, record.file, record.fencingToken, record.n));
          if (!grantsOf.has(grantKey(record.pid, record.file, record.fencingToken)))
            violation(`${record.file}: pid ${record.pid} wrote with token ${record.fencingToken} it was never granted`);
          break;
        case "write-ok":
        case "write-refused":
        case "write-error":
          outcomes.set(writeKey(record.pid, record.file, record.fencingToken, record.n), record);
          break;
        case "releasing":
          requests++;
          releasing.set(grantKey(record.pid, record.file, record.fencingToken), record);
          break;
        case "released":
        case "turn-error":
          break;
      }
    }
  }

  // ---- the journals: the protected resource.
  const inJournal = new Map<string, JournalWrite>();
  let writesAccepted = 0;
  for (const file of evidence.files) {
    const writes = evidence.journals.get(file) ?? [];
    writesAccepted += writes.length;
    const writerOf = new Map<number, number>();
    const finished = new Set<number>();
    let previous: JournalWrite | undefined;
    for (const [index, write] of writes.entries()) {
      if (write.seq !== index + 1) violation(`${file}: journal seq ${write.seq} at position ${index + 1} (seqs must run 1, 2, 3…)`);
      if (write.file !== file) violation(`${file}: journal seq ${write.seq} is a write to ${write.file}`);
      inJournal.set(writeKey(write.pid, write.file, write.fencingToken, write.n), write);
      const writer = writerOf.get(write.fencingToken);
      if (writer !== undefined && writer !== write.pid)
        violation(`${file}: token ${write.fencingToken} wrote from two processes (${writer}, ${write.pid}) — two holders with one token`);
      writerOf.set(write.fencingToken, write.pid);
      if (!attempts.has(writeKey(write.pid, write.file, write.fencingToken, write.n)))
        violation(`${file}: journal seq ${write.seq} (pid ${write.pid}, token ${write.fencingToken}, write ${write.n}) was never attempted by a client`);
      if (previous !== undefined) {
        if (write.fencingToken < previous.fencingToken) {
          violation(
            `${file}: token went down in the journal: seq ${previous.seq} token ${previous.fencingToken}, seq ${write.seq} token ${write.fencingToken}`,
          );
        }
        if (write.fencingToken !== previous.fencingToken) {
          finished.add(previous.fencingToken);
          if (finished.has(write.fencingToken))
            violation(`${file}: token ${write.fencingToken} wrote again at seq ${write.seq} after another holder's writes — two holders overlapped`);
        } else if (write.n <= previous.n) {
          violation(`${file}: token ${write.fencingToken}'s write ${write.n} at seq ${write.seq} came after its write ${previous.n}`);
        }
      }
      previous = write;
    }
    const lastGranted = Math.max(0, ...(grantsByFile.get(file)?.keys() ?? []));
    const lastToken = evidence.lastTokens.get(file) ?? 0;
    if (lastToken < lastGranted) violation(`${file}: the service's last fencing token ${lastToken} is below the granted ${lastGranted}`);
  }

  // Every acknowledged write is in the journal, where the client was told it is.
  for (const records of evidence.logs.values()) {
    for (const record of records) {
      if (record.event !== "write-ok") continue;
      const entry = inJournal.get(writeKey(record.pid, record.file, record.fencingToken, record.n));
      if (entry === undefined)
        violation(
          `${record.file}: acknowledged write (pid ${record.pid}, token ${record.fencingToken}, write ${record.n}, seq ${record.seq}) is not in the journal`,
        );
      else if (entry.seq !== record.seq) violation(`${record.file}: acknowledged write at seq ${record.seq} is at seq ${entry.seq} in the journal`);
    }
  }

  // ---- paused holders: every write they attempted after SIGCONT is refused and writes nothing.
  let staleAttempts = 0;
  let staleFencesRefused = 0;
  let pausesMidHold = 0;
  const inFlightAtPause = { accepted: 0, refused: 0 };
  const pausedGrants = new Set(evidence.pauses.map((pause) => grantKey(pause.pid, pause.file, pause.fencingToken)));
  for (const pause of evidence.pauses) {
    const records = evidence.logs.get(pause.client) ?? [];
    let attemptedAfter = 0;
    for (const record of records) {
      if (record.pid !== pause.pid || record.event !== "write-attempt") continue;
      if (record.file !== pause.file || record.fencingToken !== pause.fencingToken) continue;
      if (record.offset < pause.logOffset) {
        const outcome = outcomes.get(writeKey(record.pid, record.file, record.fencingToken, record.n));
        if (outcome !== undefined && outcome.offset >= pause.logOffset) {
          if (outcome.event === "write-ok") inFlightAtPause.accepted++;
          else if (outcome.event === "write-refused") inFlightAtPause.refused++;
        }
        continue;
      }
      attemptedAfter++;
      staleAttempts++;
      const key = writeKey(record.pid, record.file, record.fencingToken, record.n);
      const outcome = outcomes.get(key);
      const where = `${record.file}: resumed holder pid ${record.pid} (token ${record.fencingToken}) write ${record.n}`;
      if (outcome === undefined) violation(`${where} has no outcome`);
      else if (outcome.event === "write-ok") violation(`${where} was accepted with a stale fence (seq ${outcome.seq})`);
      else if (outcome.event !== "write-refused" || outcome.code !== "FailedPrecondition" || outcome.detail === null)
        violation(`${where} failed without the fence refusal: ${JSON.stringify(outcome)}`);
      else if (outcome.detail.fencingToken !== pause.fencingToken || outcome.detail.currentToken === pause.fencingToken)
        violation(`${where}: the refusal's detail is wrong: ${JSON.stringify(outcome.detail)}`);
      else staleFencesRefused++;
      if (inJournal.has(key)) violation(`${where} is in the journal`);
    }
    if (attemptedAfter > 0) pausesMidHold++;
  }
  let otherRefusals = 0;
  for (const outcome of outcomes.values()) {
    if (outcome.event === "write-refused" && !pausedGrants.has(grantKey(outcome.pid, outcome.file, outcome.fencingToken))) otherRefusals++;
  }

  // ---- handoff latency: a clean release to the next grant on the file, when that client was already waiting.
  const handoffsMs: number[] = [];
  for (const [file, byToken] of grantsByFile) {
    const tokens = [...byToken.keys()].sort((a, b) => a - b);
    for (let i = 1; i < tokens.length; i++) {
      const before = byToken.get(tokens[i - 1]!)!;
      const after = byToken.get(tokens[i]!)!;
      const released = releasing.get(grantKey(before.pid, file, tokens[i - 1]!));
      const grantKeyAfter = grantKey(after.pid, file, tokens[i]!);
      const granted = grantsOf.get(grantKeyAfter);
      const asked = askedBefore.get(grantKeyAfter);
      if (!released || !granted || !asked || asked.t >= released.t) continue;
      handoffsMs.push(granted.t - released.t);
    }
  }

  return {
    violations,
    grants,
    grantsByMode,
    writesAttempted,
    writesAccepted,
    requests,
    staleAttempts,
    staleFencesRefused,
    pausesMidHold,
    inFlightAtPause,
    otherRefusals,
    handoffsMs,
  };
}

/** The q-quantile (0..1) of `values`, nearest rank; NaN when empty. */
export function quantile(values: readonly number[], q: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
}
