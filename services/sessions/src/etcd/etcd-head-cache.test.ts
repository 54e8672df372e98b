import { describe, expect, it } from "vitest";
import type { KeyValue } from "@berth/etcd";
import { HeadCache } from "./etcd-head-cache.js";
import { NO_HEAD, type Head } from "./etcd-journal-records.js";

const tomb = { mod: 3n, lastSeq: 0, deletions: [] };
const head = (seq: number, mod: bigint, create: bigint): Head => ({ seq, mod, create, first: 1, tomb });
/** The `h/` key a watch delivers for a head at `seq`, written at `mod`, of incarnation `create`. */
const heardKv = (sessionId: string, seq: number, mod: bigint, create: bigint, first = 1): KeyValue => ({
  key: `h/${sessionId}`,
  value: new TextEncoder().encode(JSON.stringify({ seq, n: 1, w: "w", b: first })),
  createRevision: create,
  modRevision: mod,
  version: 1n,
  lease: 0n,
});

describe("the heads an instance's appends compare", () => {
  it("moves a kept head forward within its incarnation, with the tombstone it was read with, and ignores what it already has", () => {
    const cache = new HeadCache();
    cache.remember("s", head(2, 10n, 5n));
    cache.heard("put", heardKv("s", 4, 12n, 5n));
    expect(cache.get("s")).toEqual({ seq: 4, mod: 12n, create: 5n, first: 1, tomb });
    cache.heard("put", heardKv("s", 3, 11n, 5n));
    expect(cache.get("s")?.seq).toBe(4);
  });

  it("forgets a head the watch saw deleted, created again or written otherwise than it knows, and never adds a session it does not keep", () => {
    const cache = new HeadCache();
    cache.remember("s", head(2, 10n, 5n));
    cache.heard("delete", { ...heardKv("s", 0, 11n, 0n), value: new Uint8Array() });
    expect(cache.get("s")).toBeUndefined();
    cache.remember("s", head(2, 10n, 5n));
    cache.heard("put", heardKv("s", 3, 12n, 12n));
    expect(cache.get("s")).toBeUndefined();
    cache.remember("s", head(2, 10n, 5n));
    cache.heard("put", heardKv("s", 3, 12n, 5n, 7));
    expect(cache.get("s")).toBeUndefined();
    cache.remember("s", { ...NO_HEAD, tomb });
    cache.heard("put", heardKv("s", 1, 12n, 12n));
    expect(cache.get("s")).toBeUndefined();
    cache.heard("put", heardKv("other", 1, 13n, 13n));
    expect(cache.get("other")).toBeUndefined();
  });

  it("keeps a later head the watch brought over an earlier one an answer carries, but takes an answer of another incarnation", () => {
    const cache = new HeadCache();
    cache.remember("s", head(2, 10n, 5n));
    cache.heard("put", heardKv("s", 3, 12n, 5n));
    expect(cache.remember("s", head(2, 10n, 5n)).seq).toBe(3);
    expect(cache.get("s")?.seq).toBe(3);
    const deleted = { ...NO_HEAD, tomb: { mod: 14n, lastSeq: 3, deletions: [] } };
    expect(cache.remember("s", deleted)).toBe(deleted);
  });
});
