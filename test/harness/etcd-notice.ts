/**
 * Once per run (vitest's global setup): on a machine without etcd, says in one line that the tests
 * tagged etcd are skipped and how to run them; with `BERTH_REQUIRE_ETCD=1` (CI), fails
 * the run instead.
 */
import { etcdMissing, etcdRequired } from "@berth/etcd/testing";

export default function etcdNotice(): void {
  const missing = etcdMissing();
  if (missing === undefined) return;
  if (etcdRequired()) throw new Error(`BERTH_REQUIRE_ETCD is set but ${missing}`);
  console.warn(`NOTE: skipped the tests that need etcd (tagged etcd): ${missing}`);
}
