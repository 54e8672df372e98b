import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { GroupCommit, nodeCommitIo, type CommitIo, type FsyncMode } from "./group-commit.js";

interface Item {
  bytes: Buffer;
  name: string;
}

/** An io whose syncs finish only when the test says so (or at once with `auto`); writes are synchronous. */
function controlledIo(auto = false) {
  const log: string[] = [];
  const gates: Array<() => void> = [];
  let failNextWrite: Error | undefined;
  let shortWrites = false;
  const gate = () => (auto ? Promise.resolve() : new Promise<void>((resolve) => gates.push(resolve)));
  const io: CommitIo = {
    write(_fd, data, offset, length) {
      const n = shortWrites ? Math.min(length, 3) : length;
      log.push(`write:${Buffer.from(data.subarray(offset, offset + n)).toString()}`);
      if (failNextWrite) {
        const error = failNextWrite;
        failNextWrite = undefined;
        throw error;
      }
      return n;
    },
    async fdatasync() {
      log.push("sync");
      await gate();
    },
  };
  return {
    io,
    log,
    release: () => gates.splice(0).forEach((open) => open()),
    failNext: (error: Error) => (failNextWrite = error),
    setShortWrites: (on: boolean) => (shortWrites = on),
  };
}

function committer(io: CommitIo, fsync: FsyncMode) {
  const durable: string[][] = [];
  const failed: Array<{ error: string; items: string[] }> = [];
  const commit = new GroupCommit<Item>({
    fd: -1,
    fsync,
    io,
    handlers: {
      durable: (items) => durable.push(items.map((i) => i.name)),
      failed: (error, items) => failed.push({ error: error.message, items: items.map((i) => i.name) }),
    },
  });
  const item = (name: string): Item => ({ name, bytes: Buffer.from(name) });
  return { commit, durable, failed, item };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

describe("group commit", () => {
  it("batches appends that arrive while a sync is in flight", async () => {
    const ctl = controlledIo();
    const { commit, durable, item } = committer(ctl.io, "batch");
    commit.submit(item("a"));
    await tick();
    expect(ctl.log).toEqual(["write:a", "sync"]);
    commit.submit(item("b"));
    commit.submit(item("c"));
    await tick();
    commit.submit(item("d"));
    ctl.release(); // sync a
    await tick();
    expect(durable).toEqual([["a"]]);
    ctl.release(); // sync bcd
    await commit.idle();
    expect(durable).toEqual([["a"], ["b", "c", "d"]]);
    expect(ctl.log).toEqual(["write:a", "sync", "write:bcd", "sync"]);
    expect(commit.busy).toBe(false);
  });

  it("shares the first write among appends submitted in the same tick", async () => {
    const ctl = controlledIo(true);
    const { commit, durable, item } = committer(ctl.io, "batch");
    for (const name of ["a", "b", "c"]) commit.submit(item(name));
    await commit.idle();
    expect(durable).toEqual([["a", "b", "c"]]);
    expect(ctl.log.filter((l) => l === "sync")).toHaveLength(1);
  });

  it("syncs every append on its own with fsync=always", async () => {
    const ctl = controlledIo(true);
    const { commit, durable, item } = committer(ctl.io, "always");
    for (const name of ["a", "b", "c"]) commit.submit(item(name));
    await commit.idle();
    expect(durable).toEqual([["a"], ["b"], ["c"]]);
    expect(ctl.log).toEqual(["write:a", "sync", "write:b", "sync", "write:c", "sync"]);
  });

  it("never syncs with fsync=none", async () => {
    const ctl = controlledIo(true);
    const { commit, durable, item } = committer(ctl.io, "none");
    commit.submit(item("a"));
    commit.submit(item("b"));
    await commit.idle();
    expect(durable).toEqual([["a", "b"]]);
    expect(ctl.log).toEqual(["write:ab"]);
  });

  it("finishes a short write before syncing", async () => {
    const ctl = controlledIo(true);
    ctl.setShortWrites(true);
    const { commit, durable, item } = committer(ctl.io, "batch");
    commit.submit(item("abcdefg"));
    await commit.idle();
    expect(ctl.log).toEqual(["write:abc", "write:def", "write:g", "sync"]);
    expect(durable).toEqual([["abcdefg"]]);
  });

  it("fails the batch and everything queued behind it, then goes on", async () => {
    const ctl = controlledIo();
    const { commit, durable, failed, item } = committer(ctl.io, "batch");
    commit.submit(item("a"));
    await tick();
    ctl.failNext(new Error("EIO"));
    commit.submit(item("b"));
    await tick();
    commit.submit(item("c"));
    ctl.release(); // sync a; then the write of b (and c, queued behind it) fails
    await tick();
    expect(durable).toEqual([["a"]]);
    expect(failed).toEqual([{ error: "EIO", items: ["b", "c"] }]);
    commit.submit(item("d"));
    await tick();
    ctl.release();
    await commit.idle();
    expect(durable).toEqual([["a"], ["d"]]);
  });
});

it("fails a batch its beforeWrite check refuses, writing nothing, then goes on", async () => {
  const ctl = controlledIo(true);
  let refuse = true;
  const failed: Array<{ error: string; items: string[] }> = [];
  const durable: string[][] = [];
  const commit = new GroupCommit<Item>({
    fd: -1,
    fsync: "batch",
    io: ctl.io,
    handlers: {
      durable: (items) => durable.push(items.map((i) => i.name)),
      failed: (error, items) => failed.push({ error: error.message, items: items.map((i) => i.name) }),
    },
    beforeWrite: () => {
      if (refuse) throw new Error("the file moved");
    },
  });
  commit.submit({ name: "a", bytes: Buffer.from("a") });
  commit.submit({ name: "b", bytes: Buffer.from("b") });
  await commit.idle();
  expect(failed).toEqual([{ error: "the file moved", items: ["a", "b"] }]);
  expect(ctl.log).toEqual([]);
  refuse = false;
  commit.submit({ name: "c", bytes: Buffer.from("c") });
  await commit.idle();
  expect(durable).toEqual([["c"]]);
  expect(ctl.log).toEqual(["write:c", "sync"]);
});

it("checks, writes and checks again in one step, with no turn of the event loop between; a failed check after the write fails the batch", async () => {
  const ctl = controlledIo(true);
  let refuse = true;
  const failed: Array<{ error: string; items: string[] }> = [];
  const durable: string[][] = [];
  const commit = new GroupCommit<Item>({
    fd: -1,
    fsync: "batch",
    io: ctl.io,
    handlers: {
      durable: (items) => durable.push(items.map((i) => i.name)),
      failed: (error, items) => failed.push({ error: error.message, items: items.map((i) => i.name) }),
    },
    beforeWrite: () => {
      ctl.log.push("before");
      // Anything else the process does (another append, a catch-up) runs only after the step.
      queueMicrotask(() => ctl.log.push("microtask"));
    },
    afterWrite: (data) => {
      ctl.log.push(`after:${Buffer.from(data).toString()}`);
      if (refuse) throw new Error("another writer got in");
    },
  });
  commit.submit({ name: "a", bytes: Buffer.from("a") });
  commit.submit({ name: "b", bytes: Buffer.from("b") });
  await commit.idle();
  expect(failed).toEqual([{ error: "another writer got in", items: ["a", "b"] }]);
  expect(ctl.log).toEqual(["before", "write:ab", "after:ab", "microtask"]);
  refuse = false;
  commit.submit({ name: "c", bytes: Buffer.from("c") });
  await commit.idle();
  expect(durable).toEqual([["c"]]);
  expect(ctl.log.slice(4)).toEqual(["before", "write:c", "after:c", "sync", "microtask"]);
});

describe("nodeCommitIo", () => {
  let dir: string | undefined;
  afterEach(() => {
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  it("appends and syncs a real file", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-gc-"));
    const file = path.join(dir, "j.jsonl");
    const fd = fs.openSync(file, "a");
    const done: string[] = [];
    const commit = new GroupCommit<Item>({
      fd,
      fsync: "batch",
      io: nodeCommitIo,
      handlers: { durable: (items) => done.push(...items.map((i) => i.name)), failed: () => undefined },
    });
    for (const name of ["one\n", "two\n", "three\n"]) commit.submit({ name, bytes: Buffer.from(name) });
    await commit.idle();
    fs.closeSync(fd);
    expect(fs.readFileSync(file, "utf8")).toBe("one\ntwo\nthree\n");
    expect(done).toHaveLength(3);
  });

  it("trusts a sync only once the file system still takes a write afterwards", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-gc-"));
    const file = path.join(dir, "j.jsonl");
    fs.writeFileSync(file, "one\n");
    // fdatasync(2) succeeds on a descriptor open for reading; a write to it fails (EBADF), as the
    // write after a sync fails on a file system gone read-only under that sync.
    const fd = fs.openSync(file, "r");
    try {
      await expect(nodeCommitIo.fdatasync(fd)).rejects.toMatchObject({ code: "EBADF" });
    } finally {
      fs.closeSync(fd);
    }
  });
});
