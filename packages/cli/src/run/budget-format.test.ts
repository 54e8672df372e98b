import { create } from "@bufbuild/protobuf";
import { CgroupVersion, MachineSchema, SampleSource } from "@berth/api/berth/budget/v1/budget_pb";
import { describe, expect, it } from "vitest";
import { formatMachine } from "./budget-format.js";

describe("formatMachine", () => {
  const M = 1024n ** 2n;
  const machine = (version: CgroupVersion) =>
    create(MachineSchema, {
      totalBytes: 512n * M,
      availableBytes: 300n * M,
      cores: 1,
      source: SampleSource.CGROUP,
      cgroup: { path: "/docker/abc", memoryMax: 512n * M, memoryCurrent: 200n * M, cpuQuota: 1, cpusetCpus: 8, version },
    });

  it("names the cgroup hierarchy the figures were read from", () => {
    expect(formatMachine(machine(CgroupVersion.V1))).toMatch(/^cgroup v1 {2}\/docker\/abc: memory limit 512M, current 200M, quota 1 cpu, cpuset 8 cpus$/m);
    expect(formatMachine(machine(CgroupVersion.V2))).toMatch(/^cgroup v2 {2}\/docker\/abc: /m);
    // A service that does not say (it reads v2 only).
    expect(formatMachine(machine(CgroupVersion.UNSPECIFIED))).toMatch(/^cgroup {5}\/docker\/abc: /m);
  });
});
