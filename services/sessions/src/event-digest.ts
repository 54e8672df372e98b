/**
 * The digest an idempotency key is kept with: what tells a retry of an append (the same events)
 * from a different request that reuses its key. It is taken over the events as the journal holds
 * them — so a key read back from the journal after a restart gets the same digest from its entries
 * as the append had in memory, and a key written before digests existed needs nothing on disk —
 * in a canonical form (object keys sorted at every level), so that two encodings of one event that
 * differ only in key order (a map's entries, a client's field order) are the same request.
 */
import { createHash } from "node:crypto";

/** The JSON text of `value` with the keys of every object sorted; what JSON.stringify drops, dropped. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? "null";
  if (Array.isArray(value)) return `[${value.map((item) => (item === undefined ? "null" : canonicalJson(item))).join(",")}]`;
  const parts: string[] = [];
  for (const key of Object.keys(value).sort()) {
    const item = (value as Record<string, unknown>)[key];
    if (item === undefined || typeof item === "function" || typeof item === "symbol") continue;
    parts.push(`${JSON.stringify(key)}:${canonicalJson(item)}`);
  }
  return `{${parts.join(",")}}`;
}

/** SHA-256 (hex) of the canonical JSON of an append's events, in order. */
export function eventsDigest(events: readonly unknown[]): string {
  const hash = createHash("sha256");
  for (const event of events) hash.update(canonicalJson(event)).update("\n");
  return hash.digest("hex");
}
