/**
 * Group commit for one append-only file: appends that arrive while a write + fdatasync is in
 * flight wait, then go to disk together in the next single write and single fdatasync. Under
 * load the cost of an fsync is shared by every append that queued behind it, so durable appends
 * get cheaper the more of them there are, instead of queueing one fsync each.
 *
 * The write itself is synchronous, in one step with the owner's checks around it: `beforeWrite`,
 * write(2), `afterWrite`, with nothing between them that could let the event loop run. Another
 * process appending to the same file (a seed process sharing a live directory takes no lock) can
 * then only land between two adjacent system calls, and the check after the write sees it. A
 * write into the page cache takes microseconds; the fdatasync, the slow part, stays on the libuv
 * thread pool, so the event loop keeps queueing appends meanwhile.
 */
import * as fs from "node:fs";
import { confirmStillWritable } from "@berth/shared/files";

/**
 * When an append is acknowledged: `batch` after its bytes are fdatasync'ed, sharing the write and
 * the sync with every append queued meanwhile; `always` after its own write + fdatasync (no
 * sharing); `none` after write(2), as the seed does (survives a process crash, not a power loss).
 */
export type FsyncMode = "batch" | "always" | "none";

/** The file operations group commit needs; injectable so tests can count syncs and fail writes. */
export interface CommitIo {
  /** write(2) at the end of an O_APPEND file, synchronously; returns the bytes written (may be fewer than asked). */
  write(fd: number, data: Uint8Array, offset: number, length: number): number;
  /** fdatasync(2), trusted only once the file system is seen to still take writes (confirmStillWritable). */
  fdatasync(fd: number): Promise<void>;
}

/** The real thing: the write on this thread (see the module comment), the sync on the libuv thread pool. */
export const nodeCommitIo: CommitIo = {
  write: (fd, data, offset, length) => fs.writeSync(fd, data, offset, length, null),
  fdatasync: (fd) =>
    new Promise((resolve, reject) => {
      fs.fdatasync(fd, (error) => {
        if (error) return reject(error);
        try {
          confirmStillWritable(fd);
          resolve();
        } catch (notWritable) {
          reject(notWritable);
        }
      });
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
   * A write or sync failed. `items` is the failed batch (its first `attempted` items) followed by
   * everything still queued behind it (those were built on top of the failed ones, so they cannot
   * be written either, and none of their bytes is in the file). Bytes of the failed batch may be
   * partly on disk: the owner must cut the file back before it submits anything new
   * (synchronously, inside this call).
   */
  failed(error: Error, items: T[], attempted: number): void;
}

/** Options of {@link GroupCommit}. */
export interface GroupCommitOptions<T extends CommitItem> {
  fd: number;
  fsync: FsyncMode;
  io?: CommitIo;
  handlers: CommitHandlers<T>;
  /**
   * Called right before each write, in the same synchronous step. Throwing fails the batch and
   * everything queued behind it, through `failed` with that error, with nothing written.
   */
  beforeWrite?: () => void;
  /**
   * Called right after each write with the bytes written, in the same synchronous step. Throwing
   * fails the batch and everything queued behind it, through `failed` with that error; the bytes
   * are on disk then, and undoing them is the thrower's business (done before it throws).
   */
  afterWrite?: (data: Uint8Array) => void;
}

/** The group committer of one open file; see the module comment. */
export class GroupCommit<T extends CommitItem> {
  private readonly fd: number;
  private readonly fsync: FsyncMode;
  private readonly io: CommitIo;
  private readonly handlers: CommitHandlers<T>;
  private readonly beforeWrite: (() => void) | undefined;
  private readonly afterWrite: ((data: Uint8Array) => void) | undefined;
  private queue: T[] = [];
  private running = false;
  private idleWaiters: Array<() => void> = [];

  constructor(options: GroupCommitOptions<T>) {
    this.fd = options.fd;
    this.fsync = options.fsync;
    this.io = options.io ?? nodeCommitIo;
    this.handlers = options.handlers;
    this.beforeWrite = options.beforeWrite;
    this.afterWrite = options.afterWrite;
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
        const data = batch.length === 1 ? batch[0]!.bytes : Buffer.concat(batch.map((item) => item.bytes));
        // One synchronous step: no await between the check, the write and the check after it.
        this.beforeWrite?.();
        this.writeAll(data);
        this.afterWrite?.(data);
        if (this.fsync !== "none") await this.io.fdatasync(this.fd);
      } catch (error) {
        const dropped = this.queue.splice(0);
        this.handlers.failed(error instanceof Error ? error : new Error(String(error)), [...batch, ...dropped], batch.length);
        continue;
      }
      this.handlers.durable(batch);
    }
    this.running = false;
    const waiters = this.idleWaiters.splice(0);
    for (const wake of waiters) wake();
  }

  private writeAll(data: Uint8Array): void {
    let offset = 0;
    // write(2) may write less than asked (quota, signal): the rest goes in further writes, still
    // before the one fdatasync.
    while (offset < data.length) {
      const written = this.io.write(this.fd, data, offset, data.length - offset);
      if (written <= 0) throw new Error(`write returned ${written}`);
      offset += written;
    }
  }
}
