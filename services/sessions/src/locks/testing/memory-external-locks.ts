/**
 * Outside locks in memory (a test double of external-locks.ts): berth's claims and an outside
 * process's holds in one map, so the lock table's handoffs through an outside lock run without a
 * lock file. `holdOutside` and `freeOutside` play the other process.
 */
import type { ExternalClaim, ExternalLockHandle, ExternalLocks, ForeignLockHolder } from "../external-locks.js";

export interface MemoryExternalLocks extends ExternalLocks {
  /** An outside process takes `key` (false when someone has it). */
  holdOutside(key: string, holder: { owner: string; pid: number; since: number }): boolean;
  /** The outside process frees `key`; the table's watchers of it are told. */
  freeOutside(key: string): void;
  /** The keys berth holds through a claim. */
  claimedByBerth(): string[];
}

export function createMemoryExternalLocks(pid = 4242): MemoryExternalLocks {
  const held = new Map<string, { byBerth: ExternalLockHandle } | { outside: ForeignLockHolder }>();
  const watchers = new Map<string, Set<() => void>>();
  let tokens = 0;
  const pathFor = (key: string) => `memory:${key}`;
  const tell = (key: string) => {
    for (const onMaybeFree of [...(watchers.get(key) ?? [])]) onMaybeFree();
  };
  return {
    pathFor,
    claim(key): ExternalClaim {
      const current = held.get(key);
      if (current !== undefined) return "outside" in current ? { ok: false, holder: current.outside } : { ok: false };
      const handle: ExternalLockHandle = { key, lockFile: pathFor(key), token: `t${++tokens}`, pid };
      held.set(key, { byBerth: handle });
      return { ok: true, handle };
    },
    release(handle) {
      const current = held.get(handle.key);
      if (current !== undefined && "byBerth" in current && current.byBerth.token === handle.token) held.delete(handle.key);
    },
    peek(key) {
      const current = held.get(key);
      return current !== undefined && "outside" in current ? current.outside : undefined;
    },
    watch(key, onMaybeFree) {
      const set = watchers.get(key) ?? new Set();
      watchers.set(key, set);
      set.add(onMaybeFree);
      return () => {
        set.delete(onMaybeFree);
        if (set.size === 0) watchers.delete(key);
      };
    },
    holdOutside(key, holder) {
      if (held.has(key)) return false;
      held.set(key, { outside: { lockFile: pathFor(key), owner: holder.owner, pid: holder.pid, since: holder.since, readable: true } });
      return true;
    },
    freeOutside(key) {
      const current = held.get(key);
      if (current === undefined || !("outside" in current)) return;
      held.delete(key);
      tell(key);
    },
    claimedByBerth: () => [...held].filter(([, v]) => "byBerth" in v).map(([k]) => k),
  };
}
