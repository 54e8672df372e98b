import { readdirSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { etcdMissing } from "./etcd-installed.js";

const REPOSITORY = fileURLToPath(new URL("../../../../", import.meta.url));

/** Every `*.test.ts` under `dir`, leaving out installed and built code. */
function testFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) return entry.name === "node_modules" || entry.name === "dist" || entry.name.startsWith(".") ? [] : testFiles(full);
    return entry.name.endsWith(".test.ts") ? [full] : [];
  });
}

describe("etcdMissing", () => {
  it("says which binary cannot be run, the Debian package that has it and the variable that points at another", () => {
    const etcd = etcdMissing({ BERTH_ETCD_BIN: "/nonexistent/etcd", BERTH_ETCDCTL_BIN: process.execPath });
    expect(etcd).toMatch(/^\/nonexistent\/etcd cannot be run \(.*ENOENT\): install it \(Debian: apt-get install etcd-server\) or set BERTH_ETCD_BIN$/);
    const etcdctl = etcdMissing({ BERTH_ETCD_BIN: process.execPath, BERTH_ETCDCTL_BIN: "/nonexistent/etcdctl" });
    expect(etcdctl).toMatch(/^\/nonexistent\/etcdctl cannot be run .*etcd-client.*BERTH_ETCDCTL_BIN$/);
  });

  it("is undefined when both binaries start, whatever they exit with", () => {
    expect(etcdMissing({ BERTH_ETCD_BIN: process.execPath, BERTH_ETCDCTL_BIN: "false" })).toBeUndefined();
  });
});

// A test that starts etcd without the tag fails on every machine without etcd, where npm test must
// pass. Tests start it directly (startEtcd) or through the e2e harness's store parameter (onStore).
describe("the tests that start etcd", () => {
  it('are tagged etcd: by file (a module tag), by suite ({ tags: ["etcd"] }), or by storeTags(store) for the harness stores', () => {
    const starting = ["packages", "services", "test"]
      .flatMap((dir) => testFiles(path.join(REPOSITORY, dir)))
      .filter((file) => /\bstartEtcd\(|\bonStore\(/.test(readFileSync(file, "utf8")));
    expect(starting.length).toBeGreaterThan(10);
    const untagged = starting.filter((file) => !/^\/\/ @module-tag etcd$|tags: \["etcd"\]|\bstoreTags\(store\)/m.test(readFileSync(file, "utf8")));
    expect(untagged.map((file) => path.relative(REPOSITORY, file))).toEqual([]);
  });
});
