/**
 * Who holds or waits for a lock on etcd, as its waiter key (`l/<file>/w/<lease>`) records it: what
 * the lock store writes and what its watch and Inspect read back.
 */
import type { KeyValue } from "@berth/etcd";

const decoder = new TextDecoder();

/** Who holds or waits for a lock, as its waiter key records it. */
export interface EtcdLockParty {
  readonly owner: string;
  /** "lease": Acquire (renewed by KeepAlive); "stream": Hold (held while the stream lives). */
  readonly kind: "lease" | "stream";
  /** The pid of the berth instance that granted it. */
  readonly pid: number;
  /** The berth instance that granted it (its host and pid, or what it was configured with). */
  readonly instance: string;
  /** When it started waiting, or for a holder, since when it holds (ms since the epoch). */
  readonly since: number;
  /** When it gives up waiting (ms since the epoch). */
  readonly until: number;
  /** Its create revision: the fencing token once it holds the lock. */
  readonly token: bigint;
  readonly key: string;
}

export function partyOf(kv: KeyValue): EtcdLockParty {
  let value: Record<string, unknown> = {};
  try {
    if (kv.value.length > 0) value = JSON.parse(decoder.decode(kv.value)) as Record<string, unknown>;
  } catch {
    // A key written by something else than berth: shown with what is known.
  }
  return {
    owner: typeof value.owner === "string" ? value.owner : "",
    kind: value.kind === "stream" ? "stream" : "lease",
    pid: typeof value.pid === "number" ? value.pid : 0,
    instance: typeof value.instance === "string" ? value.instance : "",
    since: typeof value.since === "number" ? value.since : 0,
    until: typeof value.until === "number" ? value.until : typeof value.since === "number" ? value.since : 0,
    token: kv.createRevision,
    key: kv.key,
  };
}
