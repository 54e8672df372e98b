/**
 * berth's keys in etcd: strings under one prefix (a namespace, like etcd's own `namespace`
 * package), so that berth can share a cluster and its callers write keys relative to the prefix.
 */

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** Maps berth's relative keys to etcd's bytes and back. */
export interface KeySpace {
  /** The prefix every key carries, e.g. `berth/`. */
  readonly prefix: string;
  /** `prefix + key` as bytes. */
  encode(key: string): Uint8Array;
  /** The relative key of an etcd key under the prefix; throws for a key outside it. */
  decode(bytes: Uint8Array): string;
  /** The end of the range of every key that starts with `key` (etcd's `range_end`). */
  prefixEnd(key: string): Uint8Array;
}

/** The key space under `prefix` (may be empty: keys are then etcd's own). */
export function createKeySpace(prefix: string): KeySpace {
  const prefixBytes = encoder.encode(prefix);
  const encode = (key: string): Uint8Array => {
    const keyBytes = encoder.encode(key);
    const out = new Uint8Array(prefixBytes.length + keyBytes.length);
    out.set(prefixBytes);
    out.set(keyBytes, prefixBytes.length);
    return out;
  };
  return {
    prefix,
    encode,
    decode(bytes) {
      if (bytes.length < prefixBytes.length || prefixBytes.some((b, i) => bytes[i] !== b)) {
        throw new Error(`etcd key ${JSON.stringify(Buffer.from(bytes).toString("latin1"))} is outside berth's prefix ${JSON.stringify(prefix)}`);
      }
      return decoder.decode(bytes.subarray(prefixBytes.length));
    },
    prefixEnd: (key) => rangeEndOfPrefix(encode(key)),
  };
}

/**
 * The smallest key greater than every key starting with `bytes`: the last byte below 0xff is
 * incremented and what follows it dropped. A prefix of only 0xff bytes (or none) has no such key:
 * etcd's `\0` then means "to the end of the key space".
 */
export function rangeEndOfPrefix(bytes: Uint8Array): Uint8Array {
  for (let i = bytes.length - 1; i >= 0; i--) {
    if (bytes[i]! < 0xff) {
      const end = bytes.slice(0, i + 1);
      end[i] = bytes[i]! + 1;
      return end;
    }
  }
  return new Uint8Array([0]);
}

/** A value as bytes: strings are UTF-8. */
export function valueBytes(value: string | Uint8Array): Uint8Array {
  return typeof value === "string" ? encoder.encode(value) : value;
}
