/**
 * A value derived once per object: the one cache of the RPC layers (the sessions' wire cache of
 * snapshots and journal entries, the budget's messages and queue heartbeats).
 *
 * A domain object the layers convert (a snapshot, a policy, the list of requests ahead) is
 * immutable and shared: the domain hands out a new object on every change. So the converted
 * message, or its encoded bytes, is keyed by the object's identity — a stale one is never served —
 * in a WeakMap: it lives as long as the domain or a stream's buffer holds the object, and costs
 * nothing afterwards.
 */

/**
 * Derives a value from an object once; later calls with the same object return the same value.
 * `args` are facts that travel with the object (the same for every call with it): only the first
 * call's reach `derive`.
 */
export interface IdentityCache<K extends object, V, A extends unknown[] = []> {
  get(key: K, ...args: A): V;
}

/** An {@link IdentityCache} of `derive`. */
export function createIdentityCache<K extends object, V, A extends unknown[] = []>(derive: (key: K, ...args: A) => V): IdentityCache<K, V, A> {
  const values = new WeakMap<K, V>();
  return {
    get(key, ...args) {
      let value = values.get(key);
      if (value === undefined) {
        value = derive(key, ...args);
        values.set(key, value);
      }
      return value;
    },
  };
}
