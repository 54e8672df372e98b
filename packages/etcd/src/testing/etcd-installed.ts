/**
 * Whether this machine can run etcd for tests and benchmarks. etcd is a system package (Debian:
 * etcd-server and etcd-client), not an npm one, so a fresh clone's `npm test` may find it missing:
 * the test files that need it carry `// @module-tag etcd`, and the test configs skip that tag when
 * {@link etcdMissing} says why (test/harness/system-packages.ts), unless `BERTH_REQUIRE_ETCD=1` (CI)
 * asks for them to run.
 *
 * Imports only Node's built-ins: the vitest configs load it before any workspace is resolved.
 */
import { spawnSync } from "node:child_process";

/** The etcd binary tests start: `BERTH_ETCD_BIN`, else `etcd` on PATH. */
export function etcdBinary(env: NodeJS.ProcessEnv = process.env): string {
  return env.BERTH_ETCD_BIN ?? "etcd";
}

/** The etcdctl binary tests run: `BERTH_ETCDCTL_BIN`, else `etcdctl` on PATH. */
export function etcdctlBinary(env: NodeJS.ProcessEnv = process.env): string {
  return env.BERTH_ETCDCTL_BIN ?? "etcdctl";
}

/** Why etcd or etcdctl cannot be run here (what to install, or which variable to set), or undefined when both can. */
export function etcdMissing(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const binaries = [
    { binary: etcdBinary(env), variable: "BERTH_ETCD_BIN", debian: "etcd-server" },
    { binary: etcdctlBinary(env), variable: "BERTH_ETCDCTL_BIN", debian: "etcd-client" },
  ];
  for (const { binary, variable, debian } of binaries) {
    // Only whether it starts: `etcdctl --version` exits non-zero on some versions, and that is fine.
    const run = spawnSync(binary, ["--version"], { stdio: "ignore", timeout: 30_000 });
    if (run.error !== undefined) {
      return `${binary} cannot be run (${run.error.message}): install it (Debian: apt-get install ${debian}) or set ${variable}`;
    }
  }
  return undefined;
}
