/**
 * Sessions: every session live (WatchSessions), newest change first, and the chosen one's
 * timeline (WatchSession with snapshots): each entry, what its snapshot changed, the diagnostics.
 */
import type { SessionChange } from "@berth/api/berth/sessions/v1/session_service_pb";
import type { Berth } from "@berth/client/web";
import { useLayoutEffect, useMemo, useState } from "preact/hooks";
import { Changes, useChanges, useNow } from "./changes.js";
import { follow, type LinkState } from "./follow.js";
import { ago, msOf } from "./format.js";
import { keepView, type RevisionView } from "./revision-view.js";
import { Timeline } from "./timeline.js";
import { VirtualList } from "./virtual-list.js";

/** The sessions as the watch describes them. */
export class SessionsView implements RevisionView<SessionChange> {
  readonly changes = new Changes();
  #sessions = new Map<string, SessionChange>();
  #sorted: SessionChange[] | undefined;

  replace(current: readonly SessionChange[]): void {
    this.#sessions = new Map();
    for (const change of current) this.#set(change);
    this.#changed();
  }

  apply(change: SessionChange): void {
    this.#set(change);
    this.#changed();
  }

  get(id: string): SessionChange | undefined {
    return this.#sessions.get(id);
  }

  /** The sessions, the latest change first. */
  sorted(): readonly SessionChange[] {
    this.#sorted ??= [...this.#sessions.values()].sort(
      (a, b) => (msOf(b.appendTime) ?? 0) - (msOf(a.appendTime) ?? 0) || a.sessionId.localeCompare(b.sessionId),
    );
    return this.#sorted;
  }

  #set(change: SessionChange): void {
    if (change.deleted) this.#sessions.delete(change.sessionId);
    else this.#sessions.set(change.sessionId, change);
  }

  #changed(): void {
    this.#sorted = undefined;
    this.changes.changed();
  }
}

const ROW_HEIGHT = 34;

export function SessionsPanel({ berth, onLink }: { readonly berth: Berth; readonly onLink: (state: LinkState) => void }) {
  const view = useMemo(() => new SessionsView(), []);
  const [chosen, choose] = useState<string | undefined>(undefined);
  useChanges(view.changes);
  const now = useNow();
  // Opened as the panel is first laid out, not after the first paint: the data is the slow part of a load.
  useLayoutEffect(() => {
    const stop = new AbortController();
    void follow(
      (context) =>
        keepView(
          berth.sessions.watchSessions({ includeCurrent: true, includeCompleted: true, includeSnapshot: true, signal: context.signal }),
          view,
          context.live,
        ),
      onLink,
      stop.signal,
    );
    return () => stop.abort();
  }, [berth, view, onLink]);

  const sessions = view.sorted();
  const chosenChange = chosen === undefined ? undefined : view.get(chosen);
  return (
    <section class="panel sessions" aria-labelledby="sessions-title" id="sessions">
      <h2 id="sessions-title">
        Sessions <span class="count">{sessions.length}</span>
      </h2>
      <div class="split">
        <div class="list-column">
          {sessions.length === 0 ? (
            <p class="empty">No session yet: an append creates one.</p>
          ) : (
            <VirtualList
              items={sessions}
              rowHeight={ROW_HEIGHT}
              maxHeight={ROW_HEIGHT * 14}
              label="Sessions"
              rowKey={(change) => change.sessionId}
              render={(change) => (
                <button
                  type="button"
                  class="row-button session-row"
                  aria-pressed={change.sessionId === chosen}
                  onClick={() => choose(change.sessionId === chosen ? undefined : change.sessionId)}
                >
                  <span class="id">{change.sessionId}</span>
                  <span class="phase">{change.snapshot?.phase ?? ""}</span>
                  <span class="seq">
                    seq {String(change.lastSeq)} {change.type}
                  </span>
                  <span class="age">{ago(msOf(change.appendTime), now)}</span>
                </button>
              )}
            />
          )}
        </div>
        <div class="detail-column">
          {chosen === undefined ? (
            <p class="hint">Choose a session to see its timeline.</p>
          ) : (
            <Timeline key={chosen} berth={berth} sessionId={chosen} lastSeq={chosenChange?.lastSeq ?? 0n} />
          )}
        </div>
      </div>
    </section>
  );
}
