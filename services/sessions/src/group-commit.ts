/**
 * Group commit for one append-only file: appends that arrive while a write + fdatasync is in
 * flight wait, then go to disk together in the next single write and single fdatasync. Under
 * load the cost of an fsync is shared by every append that queued behind it, so durable appends
 * get cheaper the more of them there are, instead of queueing one fsync each.
 */
import * as fs from "node:fs";

/**
 * When an append is acknowledged: `batch` after its bytes are fdatasync'ed, sharing the write and
 * the sync with every append queued meanwhile; `always` after its own write + fdatasync (no
 * sharing); `none` after write(2), as the seed does (survives a process crash, not a power loss).
 */
export type FsyncMode = "batch" | "always" | "none";

/** The file operations group commit needs; injectable so tests can count syncs and fail writes. */
export interface CommitIo {
  /** write(2) at the end of an O_APPEND file; resolves with the bytes written (may be fewer than asked). */
  write(fd: number, data: Uint8Array, offset: number, length: number): Promise<number>;
  /** fdatasync(2). */
  fdatasync(fd: number): Promise<void>;
}

/** The real thing, on the libuv thread pool (so the event loop keeps queueing appends meanwhile). */
export const nodeCommitIo: CommitIo = {
  write: (fd, data, offset, length) =>
    new Promise((resolve, reject) => {
      fs.write(fd, data, offset, length, null, (error, written) => (error ? reject(error) : resolve(written)));
    }),
  fdatasync: (fd) =>
    new Promise((resolve, reject) => {
      fs.fdatasync(fd, (error) => (error ? reject(error) : resolve()));
    }),
};

/** One unit of work: the bytes of one append (all of its lines). */
export interface CommitItem {
  readonly bytes: Uint8Array;
}

/** What the owner of the file learns from the committer. */
export interface CommitHandlers<T extends CommitItem> {
  /** The items are on disk (durable as the mode promises), in submission order. */
  durable(items: T[]): void;
  /**
   * A write or sync failed. `items` is the failed batch followed by everything still queued
   * behind it (those were built on top of the failed ones, so they cannot be written either).
   * Bytes of the failed batch may be partly on disk: the owner must cut the file back before it
   * submits anything new (synchronously, inside this call).
   */
  failed(error: Error, items: T[]): void;
}

/** Options of {@link GroupCommit}. */
export interface GroupCommitOptions<T extends CommitItem> {
  fd: number;
  fsync: FsyncMode;
  io?: CommitIo;
  handlers: CommitHandlers<T>;
  /**
   * Called right before each write. Throwing fails the batch and everything queued behind it,
   * through `failed` with that error, with nothing written.
   */
  beforeWrite?: () => void;
}

/** The group committer of one open file; see the module comment. */
export class GroupCommit<T extends CommitItem> {
  private readonly fd: number;
  private readonly fsync: FsyncMode;
  private readonly io: CommitIo;
  private readonly handlers: CommitHandlers<T>;
  private readonly beforeWrite: (() => void) | undefined;
  private queue: T[] = [];
  private running = false;
  private idleWaiters: Array<() => void> = [];

  constructor(options: GroupCommitOptions<T>) {
    this.fd = options.fd;
    this.fsync = options.fsync;
    this.io = options.io ?? nodeCommitIo;
    this.handlers = options.handlers;
    this.beforeWrite = options.beforeWrite;
  }

  /** True while something is queued or being written: the file may hold bytes not yet acknowledged. */
  get busy(): boolean {
    return this.running || this.queue.length > 0;
  }

  /** Queues an append; the handlers report its outcome. */
  submit(item: T): void {
    this.queue.push(item);
    if (!this.running) {
      this.running = true;
      // Started on a microtask so that appends submitted in the same tick share the first write.
      queueMicrotask(() => void this.drain());
    }
  }

  /** Resolves once nothing is queued or in flight. */
  idle(): Promise<void> {
    if (!this.busy) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private async drain(): Promise<void> {
    while (this.queue.length > 0) {
      // `always` promises one sync per append, so it takes them one at a time.
      const batch = this.fsync === "always" ? this.queue.splice(0, 1) : this.queue.splice(0);
      try {
        this.beforeWrite?.();
        await this.writeAll(batch);
        if (this.fsync !== "none") await this.io.fdatasync(this.fd);
      } catch (error) {
        const dropped = this.queue.splice(0);
        this.handlers.failed(error instanceof Error ? error : new Error(String(error)), [...batch, ...dropped]);
        continue;
      }
      this.handlers.durable(batch);
    }
    this.running = false;
    const waiters = this.idleWaiters.splice(0);
    for (const wake of waiters) wake();
  }

  private async writeAll(batch: T[]): Promise<void> {
    const data = batch.length === 1 ? batch[0]!.bytes : Buffer.concat(batch.map((item) => item.bytes));
    let offset = 0;
    // write(2) may write less than asked (quota, signal): the rest goes in further writes, still
    // before the one fdatasync.
    while (offset < data.length) {
      const written = await this.io.write(this.fd, data, offset, data.length - offset);
      if (written <= 0) throw new Error(`write returned ${written}`);
      offset += written;
    }
  }
}
