/**
 * The stores a sessions service runs on, for tests parametrised over them: `file` (the state
 * directory, the default) and `etcd` (`--store etcd` on one real etcd member, started on first use
 * for the test file and stopped by {@link stopAll}). Each service gets a key prefix of its own, so
 * services on etcd are as fresh as services on a new state directory; a service given a state
 * directory gets the prefix of that directory, so that a restart on it finds its state again.
 */
import { createHash } from "node:crypto";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { onStopAll, type ServiceOptions } from "./processes.js";

/** The stores a parametrised test runs on. */
export const STORES = ["file", "etcd"] as const;
export type StoreKind = (typeof STORES)[number];

let cluster: Promise<EtcdCluster> | undefined;
let prefixes = 0;

/** A suite's options on `store`: the etcd store's carry the etcd tag, so they are skipped where etcd cannot run. */
export function storeTags(store: StoreKind): { tags: string[] } {
  return { tags: store === "etcd" ? ["etcd"] : [] };
}

/** The etcd member the test file's services use (started once, until {@link stopAll}). */
export function testEtcd(): Promise<EtcdCluster> {
  if (cluster === undefined) {
    const starting = startEtcd();
    cluster = starting;
    onStopAll(async () => {
      if (cluster === starting) cluster = undefined;
      await (await starting.catch(() => undefined))?.stop();
    });
  }
  return cluster;
}

/** `options` for a service on `store`: for etcd, the flags that put it on the test's member. */
export async function onStore(store: StoreKind, options: ServiceOptions = {}): Promise<ServiceOptions> {
  if (store === "file") return options;
  const etcd = await testEtcd();
  const prefix =
    options.stateDir === undefined ? `t${process.pid}-${++prefixes}/` : `d${createHash("sha256").update(options.stateDir).digest("hex").slice(0, 16)}/`;
  return { ...options, args: ["--store", "etcd", "--etcd-endpoints", etcd.clientUrls.join(","), "--etcd-prefix", prefix, ...(options.args ?? [])] };
}
