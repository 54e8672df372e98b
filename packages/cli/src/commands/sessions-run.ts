/**
 * The calls of `berth sessions …` (its help and command line are in sessions.ts), through
 * `@berth/client`'s sessions client: only the sessions service's generated code loads.
 */
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { JournalEntry } from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { eventToJournal, InvalidEventError } from "@berth/client/journal-events";
import { SessionsClient, type JournalEvent } from "@berth/client/sessions";
import { usageError, UsageError } from "../args.js";
import { describeFailure, reportFailure } from "../run/errors.js";
import { jsonInteger, messageJson } from "../run/json.js";
import { durationFlag, durationLike } from "../run/need-flags.js";
import { EXIT } from "../command.js";
import { styleFor, type Style } from "../terminal.js";
import type { SessionsInvocation } from "./sessions-invocation.js";

/** A subcommand's invocation, with the client and the styles of stdout. */
interface Invocation extends SessionsInvocation {
  readonly client: SessionsClient;
  /** Styles for stdout (plain unless stdout is a colour terminal). */
  readonly out: Style;
}

const RUN: Record<SessionsInvocation["subcommand"], (invocation: Invocation) => Promise<number>> = {
  append,
  get,
  list,
  delete: deleteSession,
  watch,
  journal,
};

/** Runs the subcommand; resolves with the exit code. */
export async function runSessions(invocation: SessionsInvocation, where: string): Promise<number> {
  const client = new SessionsClient({ endpoint: invocation.endpoint });
  try {
    return await RUN[invocation.subcommand]({ ...invocation, client, out: styleFor(process.stdout) });
  } catch (error) {
    // An event the API would refuse (`--field count=abc`), refused before it is sent, naming the field.
    if (error instanceof UsageError || error instanceof InvalidEventError) return usageError(where, error.message);
    return reportFailure(where, describeFailure(error, "sessions", invocation.endpoint.url), invocation.json);
  }
}

// --------------------------------------------------------------------------- append

async function append({ values, positionals, client, json }: Invocation): Promise<number> {
  const [sessionId, type] = positionals as [string, string | undefined];
  const fields = (values.field as string[] | undefined) ?? [];
  const eventJson = values.event as string | undefined;
  let events: Record<string, unknown>[];
  if (eventJson !== undefined) {
    if (fields.length > 0) throw new UsageError("give the event either as --json or as TYPE with --field, not both");
    events = parseEvents(eventJson, "--json");
  } else if (type !== undefined) {
    events = [{ type, ...parseFields(fields) }];
  } else {
    if (fields.length > 0) throw new UsageError("--field needs the event TYPE");
    if (process.stdin.isTTY) throw new UsageError("give the event: TYPE [--field KEY=VALUE]..., --json '{…}', or JSON on stdin");
    events = parseEvents(await readStdin(), "stdin");
  }
  if (events.length === 0) throw new UsageError("no event given");
  const checked: JournalEvent[] = events.map((event, i) => {
    const where = events.length > 1 ? `event ${i + 1}` : "the event";
    if (type !== undefined && eventJson !== undefined) {
      if (event.type === undefined) event = { ...event, type };
      else if (event.type !== type) throw new UsageError(`${where} has type ${JSON.stringify(event.type)} but TYPE is ${type}`);
    }
    if (typeof event.type !== "string" || event.type === "") throw new UsageError(`${where} needs a "type" (a non-empty string)`);
    if (event.id !== undefined && event.id !== sessionId) throw new UsageError(`${where} names session ${JSON.stringify(event.id)}, not ${sessionId}`);
    return event as JournalEvent;
  });

  const options = {
    expectedSeq: values["expected-seq"] === undefined ? undefined : wholeNumber(values["expected-seq"] as string, "--expected-seq"),
    idempotencyKey: values["idempotency-key"] as string | undefined,
    fence: fenceOf(values),
  };
  let firstSeq: bigint;
  let lastSeq: bigint;
  let duplicate: boolean;
  let snapshot: Snapshot | undefined;
  if (checked.length === 1) {
    const res = await client.append(sessionId, checked[0]!, options);
    ({ seq: lastSeq, duplicate, snapshot } = res);
    firstSeq = lastSeq;
    if (json) printJson({ seq: jsonInteger(res.seq), duplicate, snapshot: snapshot ? snapshotJson(snapshot) : null });
  } else {
    const res = await client.appendMany(sessionId, checked, options);
    ({ firstSeq, lastSeq, duplicate, snapshot } = res);
    if (json) printJson({ firstSeq: jsonInteger(firstSeq), lastSeq: jsonInteger(lastSeq), duplicate, snapshot: snapshot ? snapshotJson(snapshot) : null });
  }
  if (!json) {
    const seqs = firstSeq === lastSeq ? `seq ${lastSeq}` : `seqs ${firstSeq}-${lastSeq}`;
    const phase = snapshot?.phase ? ` (phase ${snapshot.phase})` : "";
    process.stdout.write(
      duplicate ? `${sessionId}: already appended with this idempotency key: ${seqs}; nothing written\n` : `${sessionId}: appended ${seqs}${phase}\n`,
    );
  }
  return EXIT.ok;
}

/** The fence of `--fence-file` and `--fence-token` (the client resolves the file against the current directory). */
function fenceOf(values: Invocation["values"]): { file: string; fencingToken: bigint } | undefined {
  const file = values["fence-file"] as string | undefined;
  const token = values["fence-token"] as string | undefined;
  if (file === undefined && token === undefined) return undefined;
  if (file === undefined || token === undefined) throw new UsageError("--fence-file and --fence-token go together");
  return { file, fencingToken: wholeNumber(token, "--fence-token") };
}

/** One event (a JSON object), several (a JSON array), or JSON lines. */
function parseEvents(text: string, where: string): Record<string, unknown>[] {
  const trimmed = text.trim();
  if (trimmed === "") return [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(trimmed);
  } catch {
    parsed = trimmed
      .split("\n")
      .filter((line) => line.trim() !== "")
      .map((line, i) => {
        try {
          return JSON.parse(line) as unknown;
        } catch (error) {
          throw new UsageError(`${where}: line ${i + 1} is not JSON (${(error as Error).message})`);
        }
      });
  }
  const list = Array.isArray(parsed) ? parsed : [parsed];
  return list.map((item, i) => {
    if (item === null || typeof item !== "object" || Array.isArray(item)) throw new UsageError(`${where}: event ${i + 1} must be a JSON object`);
    return item as Record<string, unknown>;
  });
}

/** `KEY=VALUE` pairs; a VALUE that parses as JSON is taken as JSON, anything else as a string. */
function parseFields(fields: string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const field of fields) {
    const eq = field.indexOf("=");
    if (eq <= 0) throw new UsageError(`--field ${JSON.stringify(field)}: expected KEY=VALUE`);
    const key = field.slice(0, eq);
    if (key === "type") throw new UsageError("--field type=…: the type is the TYPE argument");
    const raw = field.slice(eq + 1);
    let value: unknown = raw;
    try {
      value = JSON.parse(raw);
    } catch {
      // Not JSON: a plain string.
    }
    Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

// --------------------------------------------------------------------------- reads

async function get({ positionals, client, json, out }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  const res = await client.snapshot(sessionId);
  if (json) {
    printJson({ lastSeq: jsonInteger(res.lastSeq), snapshot: res.snapshot ? snapshotJson(res.snapshot) : null });
    return EXIT.ok;
  }
  const view = res.snapshot ? snapshotJson(res.snapshot) : {};
  const rows: Array<[string, string]> = [
    ["session", sessionId],
    ["last seq", String(res.lastSeq)],
  ];
  for (const [key, value] of Object.entries(view)) {
    if (key === "id") continue;
    rows.push([key, human(value)]);
  }
  const width = Math.max(...rows.map(([key]) => key.length));
  process.stdout.write(`${rows.map(([key, value]) => `${out.bold(key.padEnd(width))}  ${value}`).join("\n")}\n`);
  return EXIT.ok;
}

async function list({ values, client, json, out }: Invocation): Promise<number> {
  const includeCompleted = values["include-completed"] === true;
  const onePage = values["page-size"] !== undefined;
  if (values["page-token"] !== undefined && !onePage) throw new UsageError("--page-token goes with --page-size");
  const pageSize = onePage ? Number(wholeNumber(values["page-size"] as string, "--page-size", 1_000_000n)) : 0;
  if (onePage && pageSize === 0) throw new UsageError("--page-size must be at least 1");
  let pageToken = (values["page-token"] as string | undefined) ?? "";
  const sessions: Snapshot[] = [];
  for (;;) {
    const page = await client.rpc.listSessions({ includeCompleted, pageSize, pageToken });
    sessions.push(...page.sessions);
    pageToken = page.nextPageToken;
    if (onePage || pageToken === "") break;
  }
  if (json) {
    printJson({ sessions: sessions.map(snapshotJson), ...(onePage ? { nextPageToken: pageToken } : {}) });
    return EXIT.ok;
  }
  if (onePage && pageToken !== "") process.stderr.write(`${styleFor(process.stderr).dim(`-- more: --page-token ${pageToken}`)}\n`);
  if (sessions.length === 0) {
    process.stdout.write(includeCompleted ? "no sessions\n" : "no active sessions\n");
    return EXIT.ok;
  }
  const rows = [["SESSION", "PHASE", "VARIANTS", "UPDATED"]];
  for (const s of sessions) {
    rows.push([s.id, s.phase, `${s.arrivedVariants}/${s.expectedVariants}`, s.updatedAt ? timestampDate(s.updatedAt).toISOString() : "-"]);
  }
  const widths = rows[0]!.map((_, col) => Math.max(...rows.map((row) => row[col]!.length)));
  const lines = rows.map((row) => row.map((cell, col) => (col === row.length - 1 ? cell : cell.padEnd(widths[col]!))).join("  "));
  process.stdout.write(`${[out.bold(lines[0]!), ...lines.slice(1)].join("\n")}\n`);
  return EXIT.ok;
}

async function journal({ values, positionals, client, json, out }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  const fromSeq = values["from-seq"] === undefined ? 0n : wholeNumber(values["from-seq"] as string, "--from-seq");
  const limit = values.limit === undefined ? 0 : Number(wholeNumber(values.limit as string, "--limit", 0x7fffffffn));
  for await (const batch of client.rpc.readJournal({ sessionId, fromSeq, limit })) {
    for (const entry of batch.entries) printEntry(entry, json, out);
    if (batch.end?.more && !json)
      process.stderr.write(
        `${styleFor(process.stderr).dim(`-- more from seq ${batch.end.nextSeq} (last seq ${batch.end.lastSeq}): --from-seq ${batch.end.nextSeq}`)}\n`,
      );
  }
  return EXIT.ok;
}

async function deleteSession({ values, positionals, client, json }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  const expectedSeq = values["expected-seq"] === undefined ? undefined : wholeNumber(values["expected-seq"] as string, "--expected-seq");
  const res = await client.delete(sessionId, expectedSeq === undefined ? {} : { expectedSeq });
  if (json) printJson({ lastSeq: jsonInteger(res.lastSeq) });
  else process.stdout.write(`${sessionId}: deleted (its last seq was ${res.lastSeq})\n`);
  return EXIT.ok;
}

/**
 * Follows the session until Ctrl-C (exit 0). A watcher the service ended for falling behind
 * resumes where it stopped (the client does, where the service says), so nothing is missed.
 */
async function watch({ values, positionals, client, json, out }: Invocation): Promise<number> {
  const err = styleFor(process.stderr);
  const sessionId = positionals[0]!;
  const fromSeq = values["from-seq"] === undefined ? 0n : wholeNumber(values["from-seq"] as string, "--from-seq");
  const includeSnapshot = values.snapshots === true;
  const waitForSession = values["wait-for-session"] === true;
  const progressIntervalMs = durationFlag(values.progress, "--progress");
  if (progressIntervalMs !== undefined && progressIntervalMs < 100)
    throw new UsageError(`--progress must be at least ${durationLike(100, values.progress as string)}`);
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    for await (const event of client.watch(sessionId, { fromSeq, includeSnapshot, progressIntervalMs, signal: stop.signal })) {
      switch (event.kind) {
        case "entry":
          printEntry(event.entry, json, out, event.snapshot);
          break;
        case "progress": {
          const { lastSeq, sendTime } = event;
          if (json) printJson({ progress: { lastSeq: jsonInteger(lastSeq), ...(sendTime ? { sendTime: timestampIso(sendTime) } : {}) } });
          else process.stderr.write(`${err.dim(`-- still following at seq ${lastSeq}`)}\n`);
          break;
        }
        case "caughtUp": {
          const { lastSeq, snapshot } = event;
          // A session exists once its journal has an entry: caught up at seq 0, there is none. The
          // service would wait for it; a mistyped id should not look like a quiet session.
          if (lastSeq === 0n && !waitForSession) {
            throw new ConnectError(
              `session ${sessionId} does not exist (nothing was ever appended to it, or it was deleted); --wait-for-session waits for its first entry`,
              Code.NotFound,
            );
          }
          if (json) printJson({ caughtUp: { lastSeq: jsonInteger(lastSeq), ...(snapshot ? { snapshot: snapshotJson(snapshot) } : {}) } });
          else {
            process.stderr.write(`${err.dim(`-- caught up at seq ${lastSeq}; following new entries (Ctrl-C to stop)`)}\n`);
            // The backlog's entries come without snapshots: the one as of the marker stands for them.
            if (snapshot) printSnapshotSummary(snapshot, out);
          }
          break;
        }
        case "resumed":
          if (json) process.stderr.write(`${JSON.stringify({ event: "resumed", from_seq: jsonInteger(event.fromSeq), reason: "fell behind the service" })}\n`);
          else process.stderr.write(`${err.yellow(`-- fell behind the service; resuming from seq ${event.fromSeq}`)}\n`);
          break;
      }
    }
    return EXIT.ok;
  } catch (error) {
    if (stop.signal.aborted) return EXIT.ok;
    throw error;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

// --------------------------------------------------------------------------- output

/**
 * An entry as the journal holds it (`{seq, id, type, ts, event}`): a JSON line, or a human line
 * (`#seq  time  type  {keys}`; on a colour terminal the seq bold, the time dim, the type cyan).
 */
function printEntry(entry: JournalEntry, json: boolean, out: Style, snapshot?: Snapshot): void {
  const event: Record<string, unknown> = entry.event ? eventToJournal(entry.event) : {};
  const ts = entry.appendTime ? timestampIso(entry.appendTime) : undefined;
  if (json) {
    const line: Record<string, unknown> = { seq: jsonInteger(entry.seq), id: entry.sessionId, type: entry.type, ts, event: { ...event, id: entry.sessionId } };
    if (snapshot) line.snapshot = snapshotJson(snapshot);
    process.stdout.write(`${JSON.stringify(line)}\n`);
    return;
  }
  const { type: _type, ...rest } = event;
  const body = Object.keys(rest).length > 0 ? ` ${truncate(JSON.stringify(rest), 160)}` : "";
  process.stdout.write(`${out.bold(`#${entry.seq}`)}  ${out.dim(ts ?? "-")}  ${out.cyan(entry.type)}${body}\n`);
  if (snapshot) printSnapshotSummary(snapshot, out);
}

/** The snapshot's main keys on one indented line, under the entry that made it. */
function printSnapshotSummary(snapshot: Snapshot, out: Style): void {
  const s = snapshotJson(snapshot);
  const summary = ["phase", "generationPhase", "expectedVariants", "arrivedVariants", "visibleVariant"]
    .filter((key) => s[key] !== undefined)
    .map((key) => `${key}=${human(s[key]!)}`)
    .join(" ");
  process.stdout.write(`    ${out.dim("snapshot:")} ${summary}\n`);
}

/** The snapshot in its proto JSON form, whose keys are the seed's snapshot keys (integers as numbers). */
function snapshotJson(snapshot: Snapshot): JsonObject {
  return messageJson(SnapshotSchema, snapshot) as JsonObject;
}

function printJson(value: JsonValue | Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

function human(value: JsonValue): string {
  return typeof value === "string" ? value : truncate(JSON.stringify(value), 200);
}

function truncate(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

function timestampIso(ts: Timestamp): string | undefined {
  const date = timestampDate(ts);
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString();
}

function wholeNumber(raw: string, flag: string, max = BigInt(Number.MAX_SAFE_INTEGER)): bigint {
  if (!/^\d+$/.test(raw.trim())) throw new UsageError(`${flag} must be a whole number ≥ 0, got ${JSON.stringify(raw)}`);
  const value = BigInt(raw.trim());
  if (value > max) throw new UsageError(`${flag} must be at most ${max}`);
  return value;
}
