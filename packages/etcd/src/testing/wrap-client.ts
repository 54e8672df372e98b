/**
 * A client whose every method call goes through `around`: tests count the calls a store makes,
 * hold one back, or slip something in before a transaction, without a second client.
 */
import type { EtcdClient } from "../etcd-client.js";

/** Called for each method call: `call` makes it as the client would; return what the caller gets. */
export type AroundCall = (method: string, call: () => unknown, args: readonly unknown[]) => unknown;

export function wrapClient(client: EtcdClient, around: AroundCall): EtcdClient {
  return new Proxy(client, {
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver);
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => around(String(property), () => (value as (...a: unknown[]) => unknown).apply(target, args), args);
    },
  });
}

/** `client` with the name of every method called on it recorded in `calls`, in order. */
export function countCalls(client: EtcdClient): { client: EtcdClient; calls: string[] } {
  const calls: string[] = [];
  return {
    client: wrapClient(client, (method, call) => {
      calls.push(method);
      return call();
    }),
    calls,
  };
}
