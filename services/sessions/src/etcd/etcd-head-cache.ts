/**
 * The heads an instance's appends compare, kept current from a watch of every session's head.
 *
 * An append compares the head's mod revision as this instance last saw it; when another instance
 * appended since, the compare fails and the append goes again after the head it brings back: a
 * second transaction. A watch of `h/` hears every other instance's appends as they commit, usually
 * before this instance's next append to the session arrives, so that append compares the head as
 * it is and commits in one transaction.
 *
 * Only a hint: the transaction's compare decides, so a head the watch has not brought yet, or one
 * it missed while reconnecting, costs one retry as before, never a wrong seq. The watch updates
 * only the heads this instance already keeps, and only within their incarnation (a head carries
 * the tombstone read with it, which the watch does not bring): a session new to this instance, or
 * deleted and created again, is read by its next append as before.
 */
import type { Clock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import type { EtcdClient, KeyValue } from "@berth/etcd";
import { headOf, type Head } from "./etcd-journal-records.js";
import { HEADS, sessionOfHead } from "./store-keys.js";

/** Heads remembered, so that an append usually costs one round trip. */
const HEAD_CACHE_SIZE = 10_000;
/** How long after its watch failed the cache watches the heads again. */
const RESTART_AFTER_MS = 1_000;

/** The last head an instance knows per session, least recently appended to forgotten first. */
export class HeadCache {
  private readonly heads = new Map<string, Head>();

  get(sessionId: string): Head | undefined {
    return this.heads.get(sessionId);
  }

  /**
   * Keeps `head` as read or written by this instance, unless the watch already brought a later one
   * of the same incarnation (the watch and an answer race). Returns the head kept.
   */
  remember(sessionId: string, head: Head): Head {
    const known = this.heads.get(sessionId);
    const kept = known !== undefined && known.create === head.create && known.mod > head.mod ? known : head;
    this.heads.delete(sessionId);
    this.heads.set(sessionId, kept);
    if (this.heads.size > HEAD_CACHE_SIZE) this.heads.delete(this.heads.keys().next().value!);
    return kept;
  }

  forget(sessionId: string): void {
    this.heads.delete(sessionId);
  }

  /** What the watch of `h/` heard: a later head of a kept incarnation replaces it; anything else later forgets it. */
  heard(type: "put" | "delete", kv: KeyValue): void {
    const sessionId = sessionOfHead(kv.key);
    const known = this.heads.get(sessionId);
    if (known === undefined || kv.modRevision <= known.mod) return;
    if (type === "put" && known.mod !== 0n && kv.createRevision === known.create) {
      const head = decodedHead(kv, known);
      // Replaced in place: hearing of a session does not make it one this instance appends to.
      if (head !== undefined && head.first === known.first) return void this.heads.set(sessionId, head);
    }
    this.heads.delete(sessionId);
  }

  /**
   * Follows every head from now until `signal` aborts; a watch that fails is opened again shortly
   * (what it missed meanwhile costs retries, not correctness).
   */
  async follow(client: EtcdClient, options: { readonly signal: AbortSignal; readonly clock: Clock; readonly logger?: Logger | undefined }): Promise<void> {
    const { signal, clock, logger } = options;
    while (!signal.aborted) {
      try {
        for await (const batch of client.watch({ key: HEADS, prefix: true, signal })) {
          for (const event of batch.events) this.heard(event.type, event.kv);
        }
        if (!signal.aborted) throw new Error("the watch of the sessions' heads ended");
      } catch (error) {
        if (signal.aborted) return;
        logger?.warn({ err: error }, "the watch of the sessions' heads failed; appends after another instance's retry until it is back");
        await new Promise<void>((resolve) => {
          const timer = clock.setTimeout(done, RESTART_AFTER_MS);
          function done() {
            signal.removeEventListener("abort", cancel);
            resolve();
          }
          function cancel() {
            clock.clearTimeout(timer);
            done();
          }
          signal.addEventListener("abort", cancel, { once: true });
        });
      }
    }
  }
}

/** The head `kv` holds, with the tombstone of the incarnation it continues; undefined when it does not decode. */
function decodedHead(kv: KeyValue, known: Head): Head | undefined {
  try {
    return headOf(kv, known.tomb);
  } catch {
    return undefined;
  }
}
