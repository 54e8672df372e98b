/**
 * While anyone watches, the file backend follows the journal directory's change feed (inotify: no
 * polling), so that entries another process appends (a seed process sharing a live directory)
 * reach watchers as they land, not at the next call that happens to read the session. Our own
 * appends show up in the feed too; their check is one stat. The feed is dropped at the first
 * change seen with nobody watching.
 */
import * as fs from "node:fs";
import type { Logger } from "@berth/shared/logger";
import type { SessionId } from "@berth/shared/safe-id";
import { sessionIdFromFileName } from "./session-paths.js";

export interface ForeignWriteHost {
  /** Whether the store is closed (the follower stops). */
  closed(): boolean;
  /** Whether anyone watches anything, and the session `id`. */
  watching(): boolean;
  watched(id: SessionId): boolean;
  /** The session's journal changed: read what was appended; a promise when our own bytes are landing (look again once it settles). */
  changed(id: SessionId): Promise<void> | undefined;
}

export class ForeignWriteFollower {
  /** The journal directory's change feed, while anyone watches. */
  private directoryWatch: fs.FSWatcher | undefined;
  /** Sessions whose journal changed since the follower last looked (looked at once per turn). */
  private readonly changedJournals = new Set<SessionId>();

  constructor(
    private readonly dir: string,
    private readonly host: ForeignWriteHost,
    private readonly logger: Logger | undefined,
  ) {}

  /** Starts following (idempotent). */
  follow(): void {
    if (this.directoryWatch !== undefined) return;
    try {
      this.directoryWatch = fs.watch(this.dir, { persistent: false }, (_event, name) => this.journalChanged(name));
    } catch (error) {
      // Without the feed (no inotify watches left), foreign entries still arrive at the next read.
      this.logger?.warn(
        { dir: this.dir, err: error },
        "cannot follow the journal directory; entries other processes append reach watchers at the next read of their session",
      );
      return;
    }
    this.directoryWatch.on("error", (error) => {
      this.logger?.warn({ dir: this.dir, err: error }, "lost the journal directory's change feed");
      this.stop();
    });
  }

  stop(): void {
    this.directoryWatch?.close();
    this.directoryWatch = undefined;
    this.changedJournals.clear();
  }

  private journalChanged(name: string | null): void {
    if (this.host.closed() || !this.host.watching()) {
      this.stop();
      return;
    }
    const id = name === null ? undefined : sessionIdFromFileName(name);
    if (id !== undefined && this.host.watched(id)) this.catchUpSoon(id);
  }

  /** Looks at `id`'s journal on the next turn, once for every change the feed reported meanwhile. */
  private catchUpSoon(id: SessionId): void {
    if (this.changedJournals.size === 0) setImmediate(() => this.catchUpChanged());
    this.changedJournals.add(id);
  }

  /** Reads what other processes appended to the changed journals: handed to watchers as our own appends are. */
  private catchUpChanged(): void {
    const ids = [...this.changedJournals];
    this.changedJournals.clear();
    for (const id of ids) {
      if (this.host.closed()) return;
      try {
        const later = this.host.changed(id);
        // Our own bytes are landing; look again once they have.
        if (later !== undefined) {
          void later.then(() => {
            if (!this.host.closed()) this.catchUpSoon(id);
          });
        }
      } catch (error) {
        this.logger?.warn({ sessionId: id, err: error }, "could not read what another process appended");
      }
    }
  }
}
