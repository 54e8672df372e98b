import { describe, expect, it } from "vitest";
import { missingPackagesNotice, missingSystemPackages, systemPackageOptions } from "./system-packages.js";

const NO_ETCD = { BERTH_ETCD_BIN: "/nonexistent/etcd", BERTH_ETCDCTL_BIN: process.execPath };

describe("missingSystemPackages", () => {
  it("names what is missing, why and what to install, and whether the environment requires it", () => {
    const etcd = missingSystemPackages(["etcd"], NO_ETCD).find((found) => found.name === "etcd");
    expect(etcd).toEqual({ name: "etcd", why: expect.stringMatching(/^\/nonexistent\/etcd cannot be run .*apt-get install etcd-server/), required: false });
    expect(missingSystemPackages(["etcd"], { ...NO_ETCD, BERTH_REQUIRE_ETCD: "1" }).find((found) => found.name === "etcd")?.required).toBe(true);
  });

  it("probes only the packages named", () => {
    expect(missingSystemPackages([], NO_ETCD)).toEqual([]);
    expect(missingSystemPackages(["go"], NO_ETCD).map((found) => found.name)).not.toContain("etcd");
  });
});

describe("systemPackageOptions", () => {
  it("defines a tag per package, skipped only where it is missing and not required, and hands what was found to the notice", () => {
    const missing = [
      { name: "etcd", why: "no etcd", required: false },
      { name: "go", why: "no go", required: true },
    ];
    const options = systemPackageOptions(["etcd", "python", "go"], missing);
    expect(options.tags.map(({ name, skip }) => ({ name, skip }))).toEqual([
      { name: "etcd", skip: true },
      { name: "python", skip: false },
      { name: "go", skip: false },
    ]);
    expect(options.provide.missingSystemPackages).toEqual(missing);
  });

  it("defines only the tags of the packages a config names", () => {
    expect(systemPackageOptions(["etcd"], []).tags.map(({ name }) => name)).toEqual(["etcd"]);
  });
});

describe("missingPackagesNotice", () => {
  it("says one line per skipped package", () => {
    expect(missingPackagesNotice([])).toEqual({ lines: [] });
    expect(missingPackagesNotice([{ name: "python", why: "no grpcio", required: false }])).toEqual({
      lines: ["NOTE: skipped the tests that need python (tagged python): no grpcio"],
    });
  });

  it("fails the run, naming the variable, when a required package is missing", () => {
    const notice = missingPackagesNotice([
      { name: "etcd", why: "no etcd", required: true },
      { name: "go", why: "no go", required: false },
    ]);
    expect(notice.failure).toBe("BERTH_REQUIRE_ETCD is set but no etcd");
  });
});
