import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it, vi } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import type { MachineSample } from "./sampler.js";
import { loadConfig } from "@berth/shared/config";
import { SAMPLER_SETTINGS, createSampler, machineFactsOf, parsePressure, readMachineSample, samplerOptionsFromConfig } from "./sampler.js";

/** While `refuse`, every read of the sampler's fails for want of a descriptor. */
const reads = vi.hoisted(() => ({ refuse: false }));
vi.mock("node:fs", async (real) => {
  const actual = await real<typeof import("node:fs")>();
  const readFileSync = ((...args: Parameters<typeof actual.readFileSync>) => {
    if (reads.refuse) throw Object.assign(new Error("EMFILE: too many open files, open"), { code: "EMFILE" });
    return actual.readFileSync(...args);
  }) as typeof actual.readFileSync;
  return { ...actual, readFileSync, default: { ...actual, readFileSync } };
});

const G = 1024 ** 3;
const K = 1024;
const root = mkdtempSync(path.join(tmpdir(), "berth-sampler-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

let fixtures = 0;
/** Builds a fixture tree: `files` maps paths under the root ("proc/meminfo", "sys/a/memory.max") to contents. */
function fixture(files: Record<string, string>): { procRoot: string; sysRoot: string } {
  const dir = path.join(root, String(++fixtures));
  mkdirSync(path.join(dir, "proc"), { recursive: true });
  mkdirSync(path.join(dir, "sys"), { recursive: true });
  for (const [file, content] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
    writeFileSync(path.join(dir, file), content);
  }
  return { procRoot: path.join(dir, "proc"), sysRoot: path.join(dir, "sys") };
}

const meminfo = (totalKb: number, availableKb: number) =>
  `MemTotal:       ${totalKb} kB\nMemFree:         1000 kB\nMemAvailable:   ${availableKb} kB\nBuffers:          10 kB\n`;
const psiFile = (avg10: number, avg60: number) =>
  `some avg10=${avg10.toFixed(2)} avg60=${avg60.toFixed(2)} avg300=1.50 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n`;
const cores = () => 8;

const host = {
  "proc/meminfo": meminfo((16 * G) / K, (10 * G) / K),
  "proc/loadavg": "1.25 0.75 0.50 2/345 6789\n",
  "proc/self/cgroup": "0::/\n",
  "proc/pressure/cpu": psiFile(12.5, 8),
  "proc/pressure/memory": psiFile(1, 0.5),
  "proc/pressure/io": psiFile(3, 2),
};

describe("readMachineSample", () => {
  it("host only: meminfo, loadavg and /proc/pressure", async () => {
    const sample = await readMachineSample({ ...fixture(host), cores }, new ManualClock(42, 7));
    expect(sample).toEqual<MachineSample>({
      at: 42,
      monotonicAt: 7,
      source: "host",
      memTotalBytes: 16 * G,
      memAvailableBytes: 10 * G,
      totalBytes: 16 * G,
      availableBytes: 10 * G,
      cores: 8,
      load1: 1.25,
      load5: 0.75,
      load15: 0.5,
      pressure: {
        cpu: { avg10: 12.5, avg60: 8, avg300: 1.5, total: 123456, scope: "host" },
        memory: { avg10: 1, avg60: 0.5, avg300: 1.5, total: 123456, scope: "host" },
        io: { avg10: 3, avg60: 2, avg300: 1.5, total: 123456, scope: "host" },
      },
    });
  });

  it("a cgroup v2 whose parent has the tighter limit: the parent's limit and usage decide", async () => {
    const roots = fixture({
      ...host,
      "proc/self/cgroup": "0::/parent/child\n",
      "sys/parent/memory.max": `${2 * G}\n`,
      "sys/parent/memory.current": `${1.5 * G}\n`,
      "sys/parent/memory.stat": `anon 100\ninactive_file ${0.5 * G}\nactive_file 0\n`,
      "sys/parent/cpu.max": "200000 100000\n",
      "sys/parent/child/memory.max": `${4 * G}\n`,
      "sys/parent/child/memory.current": `${G}\n`,
      "sys/parent/child/memory.stat": `anon 100\ninactive_file ${0.25 * G}\n`,
      "sys/parent/child/cpu.max": "max 100000\n",
      "sys/parent/child/cpuset.cpus.effective": "0-3\n",
      "sys/parent/child/cpu.pressure": psiFile(40, 30),
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample.source).toBe("cgroup");
    expect(sample.cgroup).toEqual({
      version: "v2",
      path: "/parent/child",
      memoryLimitBytes: 2 * G,
      memoryCurrentBytes: G,
      inactiveFileBytes: 0.25 * G,
      cpuQuota: 2,
      cpusetCpus: 4,
    });
    // parent: 2G - (1.5G - 0.5G) = 1G; child: 4G - 0.75G; host: 10G. The least wins.
    expect(sample.availableBytes).toBe(G);
    expect(sample.totalBytes).toBe(2 * G);
    expect(sample.memAvailableBytes).toBe(10 * G);
    expect(sample.cpuLimit).toBe(2);
    // The cgroup's own PSI where it has it, the host's where it does not.
    expect(sample.pressure.cpu).toMatchObject({ avg10: 40, avg60: 30, scope: "cgroup" });
    expect(sample.pressure.memory).toMatchObject({ scope: "host" });
  });

  it("the host's MemAvailable caps what a generous cgroup limit leaves", async () => {
    const roots = fixture({
      ...host,
      "proc/meminfo": meminfo((16 * G) / K, G / K),
      "proc/self/cgroup": "0::/box\n",
      "sys/box/memory.max": `${8 * G}\n`,
      "sys/box/memory.current": `${G}\n`,
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample.availableBytes).toBe(G);
    // Without memory.stat the page cache counts as used: available is understated, never overstated.
    expect(sample.cgroup?.inactiveFileBytes).toBeUndefined();
  });

  it("cpu.max quota capped by the cpuset", async () => {
    const roots = fixture({
      ...host,
      "proc/self/cgroup": "0::/box\n",
      "sys/box/cpu.max": "600000 100000\n",
      "sys/box/memory.max": "max\n",
      "sys/box/cpuset.cpus.effective": "0-1,4\n",
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample.source).toBe("cgroup");
    expect(sample.cgroup?.cpuQuota).toBe(6);
    expect(sample.cgroup?.cpusetCpus).toBe(3);
    expect(sample.cpuLimit).toBe(3);
    expect(sample.cgroup?.memoryLimitBytes).toBeUndefined();
    expect(sample.availableBytes).toBe(10 * G);
  });

  it("inside a cgroup namespace (0::/) the mount root is the container's own cgroup", async () => {
    const roots = fixture({
      ...host,
      "sys/memory.max": `${3 * G}\n`,
      "sys/memory.current": `${G}\n`,
      "sys/memory.stat": "inactive_file 0\n",
      "sys/cpu.pressure": psiFile(5, 5),
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample).toMatchObject({ source: "cgroup", totalBytes: 3 * G, availableBytes: 2 * G });
    expect(sample.pressure.cpu?.scope).toBe("cgroup");
  });

  it("source host ignores the cgroup (a container budgeting for its host)", async () => {
    const roots = fixture({ ...host, "proc/self/cgroup": "0::/box\n", "sys/box/memory.max": `${G}\n`, "sys/box/memory.current": "0\n" });
    const sample = await readMachineSample({ ...roots, cores, source: "host" });
    expect(sample).toMatchObject({ source: "host", availableBytes: 10 * G, totalBytes: 16 * G });
    expect(sample.cgroup).toBeUndefined();
  });

  it("an unlimited cgroup (a plain systemd unit) counts as the host in auto mode, as a cgroup when asked", async () => {
    const files = {
      ...host,
      "proc/self/cgroup": "0::/system.slice/berth.service\n",
      "sys/system.slice/berth.service/memory.max": "max\n",
      "sys/system.slice/berth.service/memory.current": `${G}\n`,
    };
    expect((await readMachineSample({ ...fixture(files), cores })).source).toBe("host");
    const forced = await readMachineSample({ ...fixture(files), cores, source: "cgroup" });
    expect(forced.source).toBe("cgroup");
    expect(forced.cgroup).toMatchObject({ path: "/system.slice/berth.service", memoryCurrentBytes: G });
    expect(forced.availableBytes).toBe(10 * G);
  });

  it("no PSI: pressure stays empty (the gate falls back to the load average)", async () => {
    const { "proc/pressure/cpu": _c, "proc/pressure/memory": _m, "proc/pressure/io": _i, ...noPsi } = host;
    const sample = await readMachineSample({ ...fixture(noPsi), cores });
    expect(sample.pressure).toEqual({});
    expect(sample.load1).toBe(1.25);
  });

  it("missing files leave their fields undefined, never a guess", async () => {
    const sample = await readMachineSample({ ...fixture({ "proc/self/cgroup": "0::/box\n", "sys/box/memory.max": `${2 * G}\n` }), cores });
    expect(sample).toEqual<MachineSample>({
      at: sample.at,
      monotonicAt: sample.monotonicAt,
      source: "cgroup",
      memTotalBytes: undefined,
      memAvailableBytes: undefined,
      totalBytes: 2 * G,
      availableBytes: undefined,
      cores: 8,
      cpuLimit: undefined,
      load1: undefined,
      load5: undefined,
      load15: undefined,
      pressure: {},
      cgroup: {
        version: "v2",
        path: "/box",
        memoryLimitBytes: 2 * G,
        memoryCurrentBytes: undefined,
        inactiveFileBytes: undefined,
        cpuQuota: undefined,
        cpusetCpus: undefined,
      },
    });
    const empty = await readMachineSample({ ...fixture({}), cores });
    expect(empty).toMatchObject({ source: "host", memAvailableBytes: undefined, availableBytes: undefined, load1: undefined, pressure: {} });
  });

  it("reads this machine without throwing", async () => {
    const sample = await readMachineSample();
    expect(sample.cores).toBeGreaterThan(0);
  });
});

/** A mountinfo line of a cgroup hierarchy: the cgroup it shows as its root, where, and its super options (v1's controllers). */
const cgroupMount = (id: number, root: string, mountPoint: string, fsType: "cgroup" | "cgroup2", superOptions: string) =>
  `${id} 30 0:${id} ${root} ${mountPoint} rw,nosuid,nodev,noexec,relatime shared:${id} - ${fsType} cgroup ${superOptions}\n`;
/** A v1 host's mounts as systemd makes them (cpu and cpuacct together), each hierarchy showing `root`; with a unified mount, a hybrid host. */
const v1Mounts = (root: string, options: { unified?: boolean } = {}) =>
  "25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n" +
  "30 25 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n" +
  (options.unified ? cgroupMount(31, root, "/sys/fs/cgroup/unified", "cgroup2", "rw,nsdelegate") : "") +
  cgroupMount(32, root, "/sys/fs/cgroup/systemd", "cgroup", "rw,xattr,name=systemd") +
  cgroupMount(35, root, "/sys/fs/cgroup/memory", "cgroup", "rw,memory") +
  cgroupMount(36, root, "/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct") +
  cgroupMount(37, root, "/sys/fs/cgroup/cpuset", "cgroup", "rw,cpuset");
/** `/proc/self/cgroup` of a process in `path` of every v1 hierarchy (and of the unified one on a hybrid host). */
const v1Membership = (path: string, options: { unified?: boolean } = {}) =>
  `12:cpuset:${path}\n11:memory:${path}\n5:cpu,cpuacct:${path}\n1:name=systemd:${path}\n${options.unified ? `0::${path}\n` : ""}`;
/** What v1 reads when nothing is limited: LONG_MAX rounded down to the 4 KiB page. */
const V1_UNLIMITED = "9223372036854771712\n";
/** A v1 `memory.stat`: the level's own figures, then the subtree's (`total_*`) and the limit over all ancestors. */
const v1Stat = (options: { hierarchicalLimit: string; inactiveFile: number; totalInactiveFile: number }) =>
  `cache 1000\nrss 2000\ninactive_file ${options.inactiveFile}\nhierarchical_memory_limit ${options.hierarchicalLimit.trim()}\n` +
  `hierarchical_memsw_limit ${V1_UNLIMITED.trim()}\ntotal_cache 1000\ntotal_inactive_file ${options.totalInactiveFile}\n`;

describe("readMachineSample on cgroup v1 and hybrid hosts", () => {
  it("v1: the ancestors' tighter limits, usage less total_inactive_file, cfs quota -1 below a quota, capped by cpuset.cpus", async () => {
    const roots = fixture({
      ...host,
      "proc/self/cgroup": v1Membership("/parent/child"),
      "proc/self/mountinfo": v1Mounts("/"),
      "sys/memory/memory.limit_in_bytes": V1_UNLIMITED,
      "sys/memory/memory.usage_in_bytes": `${12 * G}\n`,
      "sys/memory/parent/memory.limit_in_bytes": `${2 * G}\n`,
      "sys/memory/parent/memory.usage_in_bytes": `${1.5 * G}\n`,
      "sys/memory/parent/memory.stat": v1Stat({ hierarchicalLimit: `${2 * G}`, inactiveFile: 0, totalInactiveFile: 0.5 * G }),
      "sys/memory/parent/child/memory.limit_in_bytes": V1_UNLIMITED,
      "sys/memory/parent/child/memory.usage_in_bytes": `${G}\n`,
      // The child's own inactive_file is not the subtree's: usage_in_bytes counts the subtree, so total_inactive_file goes with it.
      "sys/memory/parent/child/memory.stat": v1Stat({ hierarchicalLimit: `${2 * G}`, inactiveFile: 0.125 * G, totalInactiveFile: 0.25 * G }),
      "sys/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
      "sys/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
      "sys/cpu,cpuacct/parent/cpu.cfs_quota_us": "150000\n",
      "sys/cpu,cpuacct/parent/cpu.cfs_period_us": "100000\n",
      "sys/cpu,cpuacct/parent/child/cpu.cfs_quota_us": "-1\n",
      "sys/cpu,cpuacct/parent/child/cpu.cfs_period_us": "100000\n",
      "sys/cpuset/parent/child/cpuset.cpus": "0-3\n",
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample.source).toBe("cgroup");
    expect(sample.cgroup).toEqual({
      version: "v1",
      path: "/parent/child",
      memoryLimitBytes: 2 * G,
      memoryCurrentBytes: G,
      inactiveFileBytes: 0.25 * G,
      cpuQuota: 1.5,
      cpusetCpus: 4,
    });
    // parent: 2G - (1.5G - 0.5G) = 1G; child: unlimited; host: 10G. The least wins.
    expect(sample.availableBytes).toBe(G);
    expect(sample.totalBytes).toBe(2 * G);
    expect(sample.cpuLimit).toBe(1.5);
    // v1 has no pressure files per cgroup: the host's.
    expect(sample.pressure.cpu).toMatchObject({ avg10: 12.5, scope: "host" });
  });

  it("v1: the unlimited value and quota -1 everywhere is no limit: the host in auto mode; the cgroup's figures when asked", async () => {
    const files = {
      ...host,
      "proc/self/cgroup": v1Membership("/system.slice/berth.service"),
      "proc/self/mountinfo": v1Mounts("/"),
      "sys/memory/memory.limit_in_bytes": V1_UNLIMITED,
      "sys/memory/system.slice/memory.limit_in_bytes": V1_UNLIMITED,
      "sys/memory/system.slice/berth.service/memory.limit_in_bytes": V1_UNLIMITED,
      "sys/memory/system.slice/berth.service/memory.usage_in_bytes": `${G}\n`,
      "sys/memory/system.slice/berth.service/memory.stat": v1Stat({ hierarchicalLimit: V1_UNLIMITED, inactiveFile: 0, totalInactiveFile: 0 }),
      "sys/cpu,cpuacct/system.slice/berth.service/cpu.cfs_quota_us": "-1\n",
      "sys/cpu,cpuacct/system.slice/berth.service/cpu.cfs_period_us": "100000\n",
      "sys/cpuset/system.slice/berth.service/cpuset.cpus": "0-7\n",
    };
    expect(await readMachineSample({ ...fixture(files), cores })).toMatchObject({ source: "host", totalBytes: 16 * G, availableBytes: 10 * G });
    const forced = await readMachineSample({ ...fixture(files), cores, source: "cgroup" });
    expect(forced).toMatchObject({ source: "cgroup", totalBytes: 16 * G, availableBytes: 10 * G, cpuLimit: 8 });
    expect(forced.cgroup).toEqual({
      version: "v1",
      path: "/system.slice/berth.service",
      memoryLimitBytes: undefined,
      memoryCurrentBytes: G,
      inactiveFileBytes: 0,
      cpuQuota: undefined,
      cpusetCpus: 8,
    });
  });

  it("v1 with 64 KiB pages: their unlimited value is no limit either", async () => {
    const roots = fixture({
      ...host,
      "proc/self/cgroup": v1Membership("/box"),
      "proc/self/mountinfo": v1Mounts("/"),
      "sys/memory/box/memory.limit_in_bytes": "9223372036854710272\n",
      "sys/memory/box/memory.usage_in_bytes": `${G}\n`,
    });
    expect((await readMachineSample({ ...roots, cores })).source).toBe("host");
  });

  it("a container of a v1 host without a cgroup namespace: the mounts show its own cgroup, the ancestors' limit comes from hierarchical_memory_limit", async () => {
    const roots = fixture({
      ...host,
      "proc/self/cgroup": v1Membership("/docker/abc"),
      // The mounts show /docker/abc at each mount point; nothing above it is visible.
      "proc/self/mountinfo": v1Mounts("/docker/abc"),
      "sys/memory/memory.limit_in_bytes": `${4 * G}\n`,
      "sys/memory/memory.usage_in_bytes": `${1.5 * G}\n`,
      "sys/memory/memory.stat": v1Stat({ hierarchicalLimit: `${2 * G}`, inactiveFile: 0.5 * G, totalInactiveFile: 0.5 * G }),
      "sys/cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
      "sys/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample.cgroup).toMatchObject({ version: "v1", path: "/docker/abc", memoryLimitBytes: 2 * G, cpuQuota: 0.5, cpusetCpus: undefined });
    // The ancestor's usage cannot be read: the cgroup's own (1.5G - 0.5G) stands in: 2G - 1G.
    expect(sample).toMatchObject({ source: "cgroup", totalBytes: 2 * G, availableBytes: G, cpuLimit: 0.5 });
  });

  it("a v1 cgroup namespace (4:memory:/): the mount root is the container's cgroup, as `--memory 512m --cpus 1` sets it", async () => {
    const M = 1024 ** 2;
    const { "proc/pressure/cpu": _c, "proc/pressure/memory": _m, "proc/pressure/io": _i, ...noPsi } = host;
    const roots = fixture({
      ...noPsi,
      "proc/self/cgroup": v1Membership("/"),
      "proc/self/mountinfo": v1Mounts("/"),
      "sys/memory/memory.limit_in_bytes": `${512 * M}\n`,
      "sys/memory/memory.usage_in_bytes": `${200 * M}\n`,
      "sys/memory/memory.stat": v1Stat({ hierarchicalLimit: `${512 * M}`, inactiveFile: 50 * M, totalInactiveFile: 50 * M }),
      "sys/cpu,cpuacct/cpu.cfs_quota_us": "100000\n",
      "sys/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
      "sys/cpuset/cpuset.cpus": "0-7\n",
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample).toMatchObject({ source: "cgroup", totalBytes: 512 * M, availableBytes: 362 * M, cpuLimit: 1 });
    expect(sample.cgroup).toMatchObject({ version: "v1", path: "/", memoryLimitBytes: 512 * M, memoryCurrentBytes: 200 * M });
    // No PSI anywhere: the cpu gate falls back to the load average.
    expect(sample.pressure).toEqual({});
    expect(sample.load1).toBe(1.25);
    expect(machineFactsOf(sample)).toEqual({ totalBytes: 512 * M, cpus: 1 });
  });

  it("hybrid: v1 controllers beside a unified mount that serves systemd only: v1 is read, the unified tree's files are not", async () => {
    const roots = fixture({
      ...host,
      "proc/self/cgroup": v1Membership("/box", { unified: true }),
      "proc/self/mountinfo": v1Mounts("/", { unified: true }),
      "sys/memory/box/memory.limit_in_bytes": `${3 * G}\n`,
      "sys/memory/box/memory.usage_in_bytes": `${G}\n`,
      "sys/memory/box/memory.stat": v1Stat({ hierarchicalLimit: `${3 * G}`, inactiveFile: 0, totalInactiveFile: 0 }),
      "sys/cpu,cpuacct/box/cpu.cfs_quota_us": "200000\n",
      "sys/cpu,cpuacct/box/cpu.cfs_period_us": "100000\n",
      // What a v2 reader would take: none of it applies on a hybrid host.
      "sys/unified/box/memory.max": `${G}\n`,
      "sys/unified/box/cpu.max": "10000 100000\n",
      "sys/unified/box/cpu.pressure": psiFile(90, 90),
      "sys/memory.max": `${G}\n`,
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample.cgroup).toMatchObject({ version: "v1", path: "/box", memoryLimitBytes: 3 * G, cpuQuota: 2 });
    expect(sample).toMatchObject({ source: "cgroup", totalBytes: 3 * G, availableBytes: 2 * G, cpuLimit: 2 });
    expect(sample.pressure.cpu).toMatchObject({ avg10: 12.5, scope: "host" });
  });

  it("v2 found through mountinfo: the cgroup2 mount and the cgroup it shows", async () => {
    const roots = fixture({
      ...host,
      "proc/self/cgroup": "0::/box\n",
      "proc/self/mountinfo": cgroupMount(30, "/", "/sys/fs/cgroup", "cgroup2", "rw,nsdelegate,memory_recursiveprot"),
      "sys/box/memory.max": `${2 * G}\n`,
      "sys/box/memory.current": `${G}\n`,
      "sys/box/memory.stat": `inactive_file ${0.5 * G}\n`,
      "sys/box/cpu.max": "100000 100000\n",
      "sys/box/cpuset.cpus.effective": "0\n",
    });
    const sample = await readMachineSample({ ...roots, cores });
    expect(sample.cgroup).toEqual({
      version: "v2",
      path: "/box",
      memoryLimitBytes: 2 * G,
      memoryCurrentBytes: G,
      inactiveFileBytes: 0.5 * G,
      cpuQuota: 1,
      cpusetCpus: 1,
    });
    expect(sample).toMatchObject({ source: "cgroup", availableBytes: 1.5 * G, cpuLimit: 1 });
  });
});

describe("parsers", () => {
  it("PSI without a some line is undefined", () => {
    expect(parsePressure("full avg10=1.00 avg60=1.00 avg300=1.00 total=1\n", "host")).toBeUndefined();
  });
});

describe("createSampler", () => {
  it("samples once per interval and hands every sample to each subscriber", async () => {
    const clock = new ManualClock();
    const sampler = createSampler({ ...fixture(host), cores, clock, intervalMs: 1000 });
    const seen: number[] = [];
    sampler.onSample((s) => seen.push(s.at));
    const first = await sampler.start();
    expect(first.at).toBe(clock.now());
    expect(sampler.latest()).toBe(first);
    expect(clock.pendingTimers()).toBe(1);
    clock.advance(1000);
    await vi.waitFor(() => expect(seen).toHaveLength(2));
    expect(seen[1]! - seen[0]!).toBe(1000);
    sampler.close();
    expect(clock.pendingTimers()).toBe(0);
  });
});

describe("a sampler with no descriptor left", () => {
  it("keeps the last sample rather than publish one without figures (free memory unknown would pass every gate), and samples again once it has", async () => {
    const clock = new ManualClock();
    const errors: string[] = [];
    const logger = { debug() {}, info() {}, warn() {}, error: (_fields: object, msg?: string) => void errors.push(msg ?? "") };
    const sampler = createSampler({ ...fixture(host), cores, clock, intervalMs: 1000, logger });
    const seen: MachineSample[] = [];
    sampler.onSample((s) => seen.push(s));
    const first = await sampler.start();
    reads.refuse = true;
    try {
      await expect(readMachineSample(fixture(host))).rejects.toMatchObject({ code: "EMFILE" });
      clock.advance(1000);
      await vi.waitFor(() => expect(errors).toEqual(["budget: reading the machine failed; the last sample stays in use"]));
      expect(sampler.latest()).toBe(first);
      expect(seen).toEqual([first]);
    } finally {
      reads.refuse = false;
    }
    clock.advance(1000);
    await vi.waitFor(() => expect(seen).toHaveLength(2));
    expect(seen[1]?.availableBytes).toBe(10 * G);
    sampler.close();
  });
});

describe("sampler settings", () => {
  it("reads interval, source and roots from flags and BERTH_* variables", () => {
    const { values } = loadConfig(SAMPLER_SETTINGS, {
      argv: ["--sample-interval=250ms"],
      env: { BERTH_BUDGET_SAMPLE_SOURCE: "host", BERTH_PROC_ROOT: "/host/proc" },
    });
    expect(samplerOptionsFromConfig(values)).toEqual({ intervalMs: 250, source: "host", procRoot: "/host/proc", sysRoot: "/sys/fs/cgroup" });
    expect(() => loadConfig(SAMPLER_SETTINGS, { argv: ["--sample-interval=0s"], env: {} })).toThrow(/--sample-interval/);
  });

  it("derives the default policy's machine from a sample: the cgroup's limits when tighter", () => {
    expect(machineFactsOf({ at: 0, monotonicAt: 0, source: "cgroup", totalBytes: 2 * G, cores: 8, cpuLimit: 2, pressure: {} })).toEqual({
      totalBytes: 2 * G,
      cpus: 2,
    });
    expect(machineFactsOf({ at: 0, monotonicAt: 0, source: "host", totalBytes: 16 * G, cores: 8, pressure: {} })).toEqual({ totalBytes: 16 * G, cpus: 8 });
    expect(machineFactsOf(undefined)).toEqual({});
  });
});
