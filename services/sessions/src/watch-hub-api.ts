/**
 * What the watch hub (watch-hub.ts) takes from its store and hands its watchers (hub-watchers.ts):
 * here, so that neither imports the other for it.
 */
import type { StoredEntry } from "./journal/journal-store.js";
import type { SessionSnapshot } from "./reducer.js";

/** A newly durable entry as the store publishes it (one of an append's). */
export interface PublishedEntry extends StoredEntry {
  snapshot?: SessionSnapshot;
}

/**
 * The durable state of a session at the moment a watcher subscribed. The hub takes it right after
 * subscribing, in the same tick, so any entry made durable later reaches the watcher live.
 */
export interface WatchBacklog {
  /** The last durable seq (0 for a session without entries). */
  lastSeq: number;
  /** The durable snapshot at `lastSeq`. */
  snapshot: SessionSnapshot;
  /** Entries with seq ≥ the watcher's `fromSeq`, up to `lastSeq`, in journal order (read lazily). */
  entries(): AsyncIterator<StoredEntry>;
}
