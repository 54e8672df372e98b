/**
 * One session's timeline: its last entries (WatchSession from a little before its last seq, with
 * snapshots), each with what its snapshot changed, and the current snapshot's diagnostics. After
 * a restart of the service it goes on from the last seq it showed: nothing shown twice.
 */
import { toJson, type JsonObject } from "@bufbuild/protobuf";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import type { JournalEntry } from "@berth/api/berth/sessions/v1/session_service_pb";
import { eventToJournal, type Berth } from "@berth/client/web";
import { useEffect, useMemo, useState } from "preact/hooks";
import { Changes, useChanges } from "./changes.js";
import { follow, type LinkState } from "./follow.js";
import { clock, msOf } from "./format.js";

/** The entries a timeline keeps (the latest). */
const KEPT_ENTRIES = 200;

interface TimelineEntry {
  readonly seq: bigint;
  readonly type: string;
  readonly time: number | undefined;
  readonly event: string;
  /** What the entry's snapshot changed; undefined when the entry came without one (the backlog's). */
  readonly changed: readonly string[] | undefined;
}

class TimelineView {
  readonly changes = new Changes();
  entries: TimelineEntry[] = [];
  snapshot: Snapshot | undefined;
  nextSeq: bigint;
  #lastJson: JsonObject | undefined;

  constructor(fromSeq: bigint) {
    this.nextSeq = fromSeq;
  }

  add(entry: JournalEntry, snapshot: Snapshot | undefined): void {
    let changed: string[] | undefined;
    if (snapshot !== undefined) {
      const json = toJson(SnapshotSchema, snapshot) as JsonObject;
      changed = this.#lastJson === undefined ? undefined : differences(this.#lastJson, json);
      this.#lastJson = json;
      this.snapshot = snapshot;
    }
    this.entries.push({
      seq: entry.seq,
      type: entry.type,
      time: msOf(entry.appendTime),
      event: entry.event === undefined ? "" : JSON.stringify(eventToJournal(entry.event)),
      changed,
    });
    if (this.entries.length > KEPT_ENTRIES) this.entries.splice(0, this.entries.length - KEPT_ENTRIES);
    this.nextSeq = entry.seq + 1n;
    this.changes.changed();
  }

  current(snapshot: Snapshot | undefined): void {
    if (snapshot === undefined) return;
    this.snapshot = snapshot;
    this.#lastJson = toJson(SnapshotSchema, snapshot) as JsonObject;
    this.changes.changed();
  }
}

/** `phase: "generating" → "ready"` for each top-level field that differs (the update time aside). */
function differences(before: JsonObject, after: JsonObject): string[] {
  const out: string[] = [];
  for (const key of new Set([...Object.keys(before), ...Object.keys(after)])) {
    if (key === "updatedAt") continue;
    const was = JSON.stringify(before[key]);
    const is = JSON.stringify(after[key]);
    if (was !== is) out.push(`${key}: ${short(was)} → ${short(is)}`);
  }
  return out;
}

function short(json: string | undefined): string {
  if (json === undefined) return "unset";
  return json.length > 60 ? `${json.slice(0, 57)}…` : json;
}

export function Timeline({ berth, sessionId, lastSeq }: { readonly berth: Berth; readonly sessionId: string; readonly lastSeq: bigint }) {
  const view = useMemo(() => new TimelineView(lastSeq > BigInt(KEPT_ENTRIES) ? lastSeq - BigInt(KEPT_ENTRIES) + 1n : 1n), [sessionId]);
  const [link, setLink] = useState<LinkState>({ kind: "connecting" });
  useChanges(view.changes);
  useEffect(() => {
    const stop = new AbortController();
    void follow(
      async (context) => {
        for await (const event of berth.sessions.watch(sessionId, { fromSeq: view.nextSeq, includeSnapshot: true, signal: context.signal })) {
          if (event.kind === "entry") view.add(event.entry, event.snapshot);
          else if (event.kind === "caughtUp") {
            view.current(event.snapshot);
            context.live();
          }
        }
      },
      setLink,
      stop.signal,
    );
    return () => stop.abort();
  }, [berth, sessionId, view]);

  const diagnostics = view.snapshot?.diagnostics ?? [];
  return (
    <section class="timeline" aria-label={`Timeline of ${sessionId}`}>
      <h3>
        {sessionId} <span class="phase">{view.snapshot?.phase}</span>
        {link.kind !== "live" && <span class="link-note"> ({link.kind === "connecting" ? "connecting" : describeLink(link)})</span>}
      </h3>
      {diagnostics.length > 0 && (
        <div class="diagnostics">
          <h4>Diagnostics ({String(view.snapshot?.diagnosticsTotal ?? diagnostics.length)})</h4>
          <ul>
            {diagnostics.map((diagnostic, index) => (
              <li key={index}>{diagnostic.error}</li>
            ))}
          </ul>
        </div>
      )}
      <ol class="entries" aria-label="Entries, the latest last">
        {view.entries.map((entry) => (
          <li key={String(entry.seq)} class="entry">
            <span class="seq">#{String(entry.seq)}</span> <span class="type">{entry.type}</span> <span class="time">{clock(entry.time)}</span>
            <code class="event">{entry.event}</code>
            {entry.changed !== undefined && (
              <ul class="changed" aria-label="What the snapshot changed">
                {entry.changed.length === 0 ? <li>snapshot unchanged</li> : entry.changed.map((line) => <li key={line}>{line}</li>)}
              </ul>
            )}
          </li>
        ))}
      </ol>
    </section>
  );
}

export function describeLink(link: LinkState): string {
  switch (link.kind) {
    case "connecting":
      return "connecting…";
    case "live":
      return "live";
    case "retrying":
      return `reconnecting: ${link.reason}`;
    case "unauthenticated":
      return `needs a token: ${link.reason}`;
    case "unavailable":
      return link.reason;
  }
}
