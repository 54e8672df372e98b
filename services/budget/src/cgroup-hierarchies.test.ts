import { describe, expect, it } from "vitest";
import { locateCgroup } from "./cgroup-hierarchies.js";

const mount = (root: string, mountPoint: string, fsType: "cgroup" | "cgroup2", superOptions: string) =>
  `40 30 0:40 ${root} ${mountPoint} rw,relatime master:1 shared:2 - ${fsType} cgroup ${superOptions}\n`;

describe("locateCgroup", () => {
  it("v1: each controller's hierarchy, its cgroup and the ancestors the mount shows, innermost first; the path is the memory one's", () => {
    const location = locateCgroup(
      "9:cpuset:/a\n4:memory:/a/b\n2:cpu,cpuacct:/a/b/c\n1:name=systemd:/a\n",
      mount("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory") +
        mount("/", "/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct") +
        mount("/a", "/sys/fs/cgroup/cpuset", "cgroup", "rw,cpuset"),
      "/fixture",
    );
    expect(location).toEqual({
      version: "v1",
      path: "/a/b",
      memory: ["/fixture/memory/a/b", "/fixture/memory/a", "/fixture/memory"],
      cpu: ["/fixture/cpu,cpuacct/a/b/c", "/fixture/cpu,cpuacct/a/b", "/fixture/cpu,cpuacct/a", "/fixture/cpu,cpuacct"],
      cpuset: ["/fixture/cpuset"],
    });
  });

  it("a hybrid host reads v1; a v2 host with only a named v1 hierarchy (name=systemd) reads v2", () => {
    const hybrid = locateCgroup(
      "4:memory:/box\n1:name=systemd:/box\n0::/box\n",
      mount("/", "/sys/fs/cgroup/unified", "cgroup2", "rw") + mount("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
    );
    expect(hybrid).toMatchObject({ version: "v1", memory: ["/sys/fs/cgroup/memory/box", "/sys/fs/cgroup/memory"], cpu: undefined });
    const v2 = locateCgroup(
      "1:name=systemd:/box\n0::/box\n",
      mount("/", "/sys/fs/cgroup", "cgroup2", "rw") + mount("/", "/run/systemd-v1", "cgroup", "rw,name=systemd"),
    );
    expect(v2).toEqual({
      version: "v2",
      path: "/box",
      memory: ["/sys/fs/cgroup/box", "/sys/fs/cgroup"],
      cpu: ["/sys/fs/cgroup/box", "/sys/fs/cgroup"],
      cpuset: ["/sys/fs/cgroup/box", "/sys/fs/cgroup"],
    });
  });

  it("of several mounts of one hierarchy, the one showing the most ancestors; mount points outside /sys/fs/cgroup are read where they are", () => {
    const location = locateCgroup(
      "4:memory:/docker/abc\n",
      mount("/docker/abc", "/sys/fs/cgroup/memory", "cgroup", "rw,memory") + mount("/", "/host/cgroup/memory", "cgroup", "rw,memory"),
      "/fixture",
    );
    expect(location?.memory).toEqual(["/host/cgroup/memory/docker/abc", "/host/cgroup/memory/docker", "/host/cgroup/memory"]);
  });

  it("a path with mountinfo's escapes", () => {
    const location = locateCgroup("0::/my box\n", mount("/", "/sys/fs/cgroup/with\\040space", "cgroup2", "rw"));
    expect(location?.memory).toEqual(["/sys/fs/cgroup/with space/my box", "/sys/fs/cgroup/with space"]);
  });

  it("a cgroup the mounts do not show (outside the mount's root, or above a namespace's) has no directories, never another's", () => {
    expect(locateCgroup("4:memory:/other\n", mount("/docker/abc", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"))).toMatchObject({
      version: "v1",
      path: "/other",
      memory: undefined,
    });
    expect(locateCgroup("0::/../sibling\n", mount("/", "/sys/fs/cgroup", "cgroup2", "rw"))?.memory).toBeUndefined();
    // A controller whose hierarchy is not mounted at all.
    expect(locateCgroup("4:memory:/\n", "")?.memory).toBeUndefined();
  });

  it("without a mountinfo: the layout systemd and Docker make, under the root", () => {
    expect(locateCgroup("0::/box\n", undefined, "/fixture")?.memory).toEqual(["/fixture/box", "/fixture"]);
    expect(locateCgroup("4:memory:/box\n3:cpu,cpuacct:/box\n", undefined, "/fixture")).toMatchObject({
      version: "v1",
      memory: ["/fixture/memory/box", "/fixture/memory"],
      cpu: ["/fixture/cpu/box", "/fixture/cpu"],
    });
  });

  it("no /proc/self/cgroup, or no line the sampler reads: no cgroup", () => {
    expect(locateCgroup(undefined, undefined)).toBeUndefined();
    expect(locateCgroup("1:name=systemd:/box\n", undefined)).toBeUndefined();
    expect(locateCgroup("", undefined)).toBeUndefined();
  });
});
