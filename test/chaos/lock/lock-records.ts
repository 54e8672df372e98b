/**
 * What the lock chaos suite's client processes write down, shared by the client
 * (`lock-client.ts`), which writes it, and the suite (`lock-chaos.test.ts`), which checks it.
 *
 * Each client slot appends JSON lines to its own log file (O_APPEND, one `write` per line, so a
 * SIGKILL never leaves half a line) and to its stdout, which the suite reads live to count grants
 * and to pick holders to pause. The journal itself is the protected resource: every write a holder
 * makes is an `AppendEvent` fenced with its lock's fencing token, carrying a {@link ProtectedWrite}.
 *
 * Times (`t`) are wall-clock milliseconds, used only to report handoff latency: no check depends
 * on them.
 */

/** How a client took its lock: a Hold stream, or Acquire + KeepAlive + Release. */
export type LockMode = "hold" | "lease";

/** Fields every record carries. */
interface RecordBase {
  /** The client slot (0..7); a respawned process keeps its slot and log file. */
  readonly client: number;
  /** The writing process. */
  readonly pid: number;
  /** The file as given to the lock service (relative to the project root). */
  readonly file: string;
  /** Wall-clock ms (reporting only). */
  readonly t: number;
}

/** The FenceRejected detail a refused write came back with. */
export interface RefusalDetail {
  readonly file: string;
  readonly fencingToken: number;
  readonly currentToken: number;
}

/** One line of a client's log. */
export type LockRecord =
  | (RecordBase & { readonly event: "asked"; readonly mode: LockMode })
  | (RecordBase & { readonly event: "granted"; readonly mode: LockMode; readonly fencingToken: number; readonly ttlMs: number | null })
  | (RecordBase & { readonly event: "write-attempt"; readonly fencingToken: number; readonly n: number })
  | (RecordBase & { readonly event: "write-ok"; readonly fencingToken: number; readonly n: number; readonly seq: number })
  | (RecordBase & {
      readonly event: "write-refused";
      readonly fencingToken: number;
      readonly n: number;
      readonly code: string;
      readonly detail: RefusalDetail | null;
    })
  | (RecordBase & { readonly event: "write-error"; readonly fencingToken: number; readonly n: number; readonly code: string; readonly message: string })
  | (RecordBase & { readonly event: "releasing"; readonly fencingToken: number })
  | (RecordBase & { readonly event: "released"; readonly fencingToken: number; readonly lost: boolean; readonly released: boolean | null })
  | (RecordBase & { readonly event: "turn-error"; readonly mode: LockMode; readonly code: string; readonly message: string });

/** A record with where its line starts in the log file (to split a log at the moment of a pause). */
export type LoggedRecord = LockRecord & { readonly offset: number };

/** The event fields of one protected write in the journal (an `other` event of type {@link WRITE_EVENT_TYPE}). */
export interface ProtectedWrite {
  readonly file: string;
  readonly fencingToken: number;
  readonly client: number;
  readonly pid: number;
  /** 1, 2, 3… within one grant. */
  readonly n: number;
}

/** The journal event type of a protected write. */
export const WRITE_EVENT_TYPE = "lock_chaos_write";

/** How a client process is told what to do (its only argument, as JSON). */
export interface LockClientConfig {
  /** The sessions service's base URL. */
  readonly url: string;
  /** This slot's log file (appended to). */
  readonly logPath: string;
  readonly client: number;
  /** The files taken in turns; `sessions[i]` is the journal that `files[i]`'s holders write to. */
  readonly files: readonly string[];
  readonly sessions: readonly string[];
  /** Share of turns taken with Hold (the rest with Acquire + KeepAlive + Release). */
  readonly holdShare: number;
  /** Lease ttl of Acquire turns (short, so that a paused holder loses its lock). */
  readonly leaseTtlMs: number;
  /** Protected writes per grant, a whole number in [min, max], and the pause before each write after the first, ms in [0, max]. */
  readonly hold: WritePlan;
  readonly lease: WritePlan;
}

/** How many protected writes a grant makes, and how far apart. */
export interface WritePlan {
  readonly writesMin: number;
  readonly writesMax: number;
  readonly pauseMaxMs: number;
}

/** The session a file's holders write to. */
export function sessionOfFile(config: Pick<LockClientConfig, "files" | "sessions">, file: string): string {
  const index = config.files.indexOf(file);
  const session = config.sessions[index];
  if (session === undefined) throw new Error(`no session for file ${file}`);
  return session;
}

/**
 * Parses a log file's text into records with their byte offsets; `bad` collects lines that do not
 * parse (a line is written by one `write` call, so there should be none).
 */
export function parseLog(text: string): { records: LoggedRecord[]; bad: string[] } {
  const records: LoggedRecord[] = [];
  const bad: string[] = [];
  let offset = 0;
  for (const line of text.split("\n")) {
    const start = offset;
    offset += Buffer.byteLength(line) + 1;
    if (line.length === 0) continue;
    try {
      const parsed = JSON.parse(line) as LockRecord;
      if (typeof parsed !== "object" || parsed === null || typeof parsed.event !== "string") throw new Error("not a record");
      records.push({ ...parsed, offset: start });
    } catch {
      bad.push(line);
    }
  }
  return { records, bad };
}
