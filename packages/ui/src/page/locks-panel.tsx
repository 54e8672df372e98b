/**
 * Locks: each file's holder (owner, fencing token, age, lease countdown) and waiters in order,
 * and the grants, releases and expiries as they happen (WatchLocks). Renewals are not events: a
 * countdown that reaches zero with no expiry reported asks the service once (Inspect) for the
 * lease's new end.
 */
import { HolderKind, LockEventKind, type LockEvent } from "@berth/api/berth/locks/v1/lock_service_pb";
import type { Berth } from "@berth/client/web";
import { useEffect, useLayoutEffect, useMemo } from "preact/hooks";
import { Changes, useChanges, useNow } from "./changes.js";
import { DataTable } from "./data-table.js";
import { follow, type LinkState } from "./follow.js";
import { ago, clock, msOf, span } from "./format.js";
import { keepView, type RevisionView } from "./revision-view.js";

interface Holder {
  readonly owner: string;
  readonly fencingToken: bigint;
  readonly since: number | undefined;
  expires: number | undefined;
  readonly kind: HolderKind;
}

interface Waiter {
  readonly owner: string;
  readonly since: number | undefined;
}

interface LockState {
  holder: Holder | undefined;
  readonly waiters: Waiter[];
}

/** The happenings the log keeps. */
const LOGGED = new Set([LockEventKind.GRANTED, LockEventKind.RELEASED, LockEventKind.EXPIRED, LockEventKind.WAITER_JOINED, LockEventKind.WAITER_LEFT]);
const KEPT_LOG = 50;
/** How soon a countdown past zero asks again. */
const REFRESH_EVERY_MS = 2000;

export class LocksView implements RevisionView<LockEvent> {
  readonly changes = new Changes();
  files = new Map<string, LockState>();
  log: LockEvent[] = [];
  readonly #asked = new Map<string, number>();

  replace(current: readonly LockEvent[]): void {
    this.files = new Map();
    for (const event of current) this.#apply(event);
    this.changes.changed();
  }

  apply(event: LockEvent): void {
    this.#apply(event);
    if (LOGGED.has(event.kind)) {
      this.log.unshift(event);
      if (this.log.length > KEPT_LOG) this.log.length = KEPT_LOG;
    }
    this.changes.changed();
  }

  /** A lease's end as Inspect says; the holder may have renewed it. */
  refreshed(file: string, owner: string, expires: number | undefined): void {
    const holder = this.files.get(file)?.holder;
    if (holder?.owner === owner) holder.expires = expires;
    this.changes.changed();
  }

  /** Whether to ask for `file`'s lease again now. */
  shouldAsk(file: string, now: number): boolean {
    const last = this.#asked.get(file) ?? 0;
    if (now - last < REFRESH_EVERY_MS) return false;
    this.#asked.set(file, now);
    return true;
  }

  #apply(event: LockEvent): void {
    let state = this.files.get(event.file);
    if (state === undefined) this.files.set(event.file, (state = { holder: undefined, waiters: [] }));
    const time = msOf(event.time);
    switch (event.kind) {
      case LockEventKind.GRANTED:
      case LockEventKind.CURRENT_HOLDER: {
        state.holder = { owner: event.owner, fencingToken: event.fencingToken, since: time, expires: msOf(event.expireTime), kind: event.holderKind };
        if (event.kind === LockEventKind.GRANTED) removeWaiter(state.waiters, event.owner, 1);
        break;
      }
      case LockEventKind.RELEASED:
      case LockEventKind.EXPIRED:
        if (state.holder !== undefined && (event.fencingToken === 0n || state.holder.fencingToken === event.fencingToken)) state.holder = undefined;
        break;
      case LockEventKind.WAITER_JOINED:
      case LockEventKind.CURRENT_WAITER:
        state.waiters.splice(Math.max(0, Math.min(state.waiters.length, event.position - 1)), 0, { owner: event.owner, since: time });
        break;
      case LockEventKind.WAITER_LEFT:
        removeWaiter(state.waiters, event.owner, event.position);
        break;
    }
    if (state.holder === undefined && state.waiters.length === 0) this.files.delete(event.file);
  }
}

/** Takes out the waiter `owner` at `position` (1-based), or the first of that owner. */
function removeWaiter(waiters: Waiter[], owner: string, position: number): void {
  const at = waiters[position - 1]?.owner === owner ? position - 1 : waiters.findIndex((waiter) => waiter.owner === owner);
  if (at >= 0) waiters.splice(at, 1);
}

const KIND_WORDS: Record<number, string> = {
  [LockEventKind.GRANTED]: "granted",
  [LockEventKind.RELEASED]: "released",
  [LockEventKind.EXPIRED]: "expired",
  [LockEventKind.WAITER_JOINED]: "waits",
  [LockEventKind.WAITER_LEFT]: "stopped waiting",
};

export function LocksPanel({ berth, onLink }: { readonly berth: Berth; readonly onLink: (state: LinkState) => void }) {
  const view = useMemo(() => new LocksView(), []);
  useChanges(view.changes);
  const now = useNow();
  // Opened as the panel is first laid out, not after the first paint: the data is the slow part of a load.
  useLayoutEffect(() => {
    const stop = new AbortController();
    void follow((context) => keepView(berth.locks.watch(undefined, { includeCurrent: true, signal: context.signal }), view, context.live), onLink, stop.signal);
    return () => stop.abort();
  }, [berth, view, onLink]);

  // A lease past its end with no expiry reported was renewed, most likely: ask for its new end.
  useEffect(() => {
    for (const [file, { holder }] of view.files) {
      if (holder?.expires === undefined || holder.expires > now || !view.shouldAsk(file, now)) continue;
      berth.locks
        .inspect(file)
        .then((answer) => view.refreshed(file, holder.owner, answer.holder?.owner === holder.owner ? msOf(answer.holder.expireTime) : undefined))
        .catch(() => undefined);
    }
  }, [now, berth, view]);

  const files = [...view.files.entries()].sort(([a], [b]) => a.localeCompare(b));
  return (
    <section class="panel locks" aria-labelledby="locks-title" id="locks">
      <h2 id="locks-title">
        Locks <span class="count">{files.length}</span>
      </h2>
      {files.length === 0 ? (
        <p class="empty">No lock is held or waited for.</p>
      ) : (
        <DataTable caption="Locks: holders and waiters by file" columns={["File", "Holder", "Token", "Held for", "Lease", "Waiters, in order"]}>
          {files.map(([file, { holder, waiters }]) => (
            <tr key={file}>
              <th scope="row" class="file">
                {file}
              </th>
              <td>{holder?.owner ?? "–"}</td>
              <td class="number">{holder === undefined ? "–" : String(holder.fencingToken)}</td>
              <td>{holder?.since === undefined ? "–" : span(now - holder.since)}</td>
              <td>{leaseText(holder, now)}</td>
              <td>
                {waiters.length === 0 ? (
                  "none"
                ) : (
                  <ol class="waiters">
                    {waiters.map((waiter, index) => (
                      <li key={index}>
                        {waiter.owner} <span class="age">{ago(waiter.since, now)}</span>
                      </li>
                    ))}
                  </ol>
                )}
              </td>
            </tr>
          ))}
        </DataTable>
      )}
      <h3>As they happen</h3>
      {view.log.length === 0 ? (
        <p class="empty">Nothing yet.</p>
      ) : (
        <ol class="log" aria-label="Lock events, the latest first">
          {view.log.map((event) => (
            <li key={`${event.revision}-${event.kind}-${event.owner}-${event.position}`}>
              <span class="time">{clock(msOf(event.time))}</span> {event.file}: {event.owner} {KIND_WORDS[event.kind]}
              {event.fencingToken > 0n ? ` (token ${event.fencingToken})` : ""}
              {event.kind === LockEventKind.WAITER_JOINED ? ` at ${event.position}` : ""}
            </li>
          ))}
        </ol>
      )}
    </section>
  );
}

function leaseText(holder: Holder | undefined, now: number): string {
  if (holder === undefined) return "–";
  const kind = holder.kind === HolderKind.STREAM ? "while its stream is open" : "";
  if (holder.expires === undefined) return kind || "–";
  const left = holder.expires - now;
  return `${left > 0 ? `${span(left)} left` : "renewing…"}${kind ? ` (${kind})` : ""}`;
}
