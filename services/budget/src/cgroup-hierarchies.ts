/**
 * Where the process's cgroup is: which hierarchy holds the memory and cpu controllers, cgroup v2's
 * unified one or v1's one per controller, and the directories of the process's cgroup and of the
 * ancestors the mounts show.
 *
 * `/proc/self/cgroup` names the process's cgroup in every hierarchy (`4:memory:/docker/abc` on v1,
 * `0::/path` on v2; `/` inside a cgroup namespace). `/proc/self/mountinfo` says where each hierarchy
 * is mounted and which of its cgroups the mount shows as its root: a container without a cgroup
 * namespace sees its own cgroup, `/docker/abc`, at /sys/fs/cgroup/memory, and none of its ancestors.
 * A hybrid host has both kinds: v1 hierarchies for the controllers and a unified v2 mount that serves
 * systemd only (its `0::` line names a cgroup with no limits to read), so a v1 line naming memory,
 * cpu or cpuset makes the limits v1's.
 */
import * as path from "node:path";

export type CgroupVersion = "v1" | "v2";

/** Where the cgroup mounts are on a usual machine; mount points under it are read under the configured root. */
export const DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup";

/** The process's cgroup, found in its hierarchies. */
export interface CgroupLocation {
  version: CgroupVersion;
  /** The cgroup's path as `/proc/self/cgroup` names it: v2's, or on v1 the memory hierarchy's (else the cpu one's). */
  path: string;
  /**
   * For each controller, the cgroup's directory and those of its ancestors up to its mount's root,
   * innermost first; undefined where the controller's hierarchy is not mounted or the mount does not
   * show the cgroup. On v2 the three are the same.
   */
  memory?: string[] | undefined;
  cpu?: string[] | undefined;
  cpuset?: string[] | undefined;
}

/** One line of `/proc/self/cgroup`: v1's name the hierarchy's controllers, v2's (`0::path`) none. */
interface Membership {
  version: CgroupVersion;
  controllers: string[];
  path: string;
}

/** A mounted cgroup hierarchy: its controllers (v1), the cgroup it shows as its root, and where. */
interface CgroupMount {
  version: CgroupVersion;
  controllers: string[];
  root: string;
  mountPoint: string;
}

const CONTROLLERS = ["memory", "cpu", "cpuset"] as const;
type Controller = (typeof CONTROLLERS)[number];

function parseMemberships(text: string): Membership[] {
  const memberships: Membership[] = [];
  for (const line of text.split("\n")) {
    // A path may hold a colon: split on the first two only.
    const match = /^(\d+):([^:]*):(.*)$/.exec(line.trim());
    if (!match) continue;
    const v2 = match[1] === "0" && match[2] === "";
    memberships.push({ version: v2 ? "v2" : "v1", controllers: v2 ? [] : match[2]!.split(","), path: match[3] || "/" });
  }
  return memberships;
}

/** mountinfo writes a space, tab, newline or backslash in a path as an octal escape (`\040`). */
function unescapeMountPath(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)));
}

/** The cgroup mounts of a mountinfo: `id parent dev root mount-point options [optional…] - fstype source super-options`. */
function parseCgroupMounts(mountinfo: string): CgroupMount[] {
  const mounts: CgroupMount[] = [];
  for (const line of mountinfo.split("\n")) {
    const fields = line.trim().split(" ");
    const separator = fields.indexOf("-");
    if (separator < 6) continue;
    const fsType = fields[separator + 1];
    if (fsType !== "cgroup" && fsType !== "cgroup2") continue;
    mounts.push({
      version: fsType === "cgroup2" ? "v2" : "v1",
      controllers: fsType === "cgroup" ? (fields[separator + 3] ?? "").split(",") : [],
      root: unescapeMountPath(fields[3]!),
      mountPoint: unescapeMountPath(fields[4]!),
    });
  }
  return mounts;
}

/**
 * Without a readable mountinfo (a proc root that has none): the layout systemd and Docker make, the
 * v2 mount at the root, v1's hierarchies in directories named after their controllers (`cpu` is a
 * link to `cpu,cpuacct` where they are mounted together), each showing the whole hierarchy.
 */
function conventionalMounts(): CgroupMount[] {
  return [
    { version: "v2", controllers: [], root: "/", mountPoint: DEFAULT_CGROUP_ROOT },
    ...CONTROLLERS.map((c): CgroupMount => ({ version: "v1", controllers: [c], root: "/", mountPoint: path.posix.join(DEFAULT_CGROUP_ROOT, c) })),
  ];
}

/** A mount point under /sys/fs/cgroup, read under `cgroupRoot` instead (a fixture tree, or the host's cgroups mounted elsewhere). */
function underCgroupRoot(mountPoint: string, cgroupRoot: string): string {
  const relative = path.posix.relative(DEFAULT_CGROUP_ROOT, mountPoint);
  if (relative.startsWith("..") || path.posix.isAbsolute(relative)) return mountPoint;
  return path.join(cgroupRoot, relative);
}

/** The cgroup's path below the mount's root, or undefined when the mount does not show it (outside the root, or `..` of a namespace). */
function below(root: string, cgroupPath: string): string[] | undefined {
  if (cgroupPath.split("/").includes("..")) return undefined;
  const relative = path.posix.relative(root, cgroupPath);
  if (relative.startsWith("..") || path.posix.isAbsolute(relative)) return undefined;
  return relative.split("/").filter((part) => part !== "" && part !== ".");
}

/**
 * The cgroup's directory in the hierarchy and its ancestors', innermost first, ending at the mount
 * point. Of several mounts of one hierarchy, the one whose root is highest shows the most ancestors.
 */
function levelsIn(mounts: CgroupMount[], cgroupPath: string, cgroupRoot: string): string[] | undefined {
  let best: { mount: CgroupMount; parts: string[] } | undefined;
  for (const mount of mounts) {
    const parts = below(mount.root, cgroupPath);
    if (parts !== undefined && (best === undefined || mount.root.length < best.mount.root.length)) best = { mount, parts };
  }
  if (best === undefined) return undefined;
  const top = underCgroupRoot(best.mount.mountPoint, cgroupRoot);
  const levels: string[] = [];
  for (let depth = best.parts.length; depth >= 0; depth--) levels.push(path.join(top, ...best.parts.slice(0, depth)));
  return levels;
}

/**
 * Finds the process's cgroup from the texts of `/proc/self/cgroup` and `/proc/self/mountinfo`
 * (undefined when unreadable). Undefined when the process is in no cgroup hierarchy the sampler reads.
 */
export function locateCgroup(
  selfCgroup: string | undefined,
  mountinfo: string | undefined,
  cgroupRoot: string = DEFAULT_CGROUP_ROOT,
): CgroupLocation | undefined {
  if (selfCgroup === undefined) return undefined;
  const memberships = parseMemberships(selfCgroup);
  const mounts = mountinfo === undefined ? conventionalMounts() : parseCgroupMounts(mountinfo);
  const v1 = (controller: Controller) => memberships.find((m) => m.version === "v1" && m.controllers.includes(controller));
  if (CONTROLLERS.some((c) => v1(c) !== undefined)) {
    const levelsOf = (controller: Controller) => {
      const membership = v1(controller);
      if (membership === undefined) return undefined;
      const hierarchy = mounts.filter((m) => m.version === "v1" && m.controllers.includes(controller));
      return levelsIn(hierarchy, membership.path, cgroupRoot);
    };
    return {
      version: "v1",
      path: (v1("memory") ?? v1("cpu") ?? v1("cpuset"))!.path,
      memory: levelsOf("memory"),
      cpu: levelsOf("cpu"),
      cpuset: levelsOf("cpuset"),
    };
  }
  const unified = memberships.find((m) => m.version === "v2");
  if (unified === undefined) return undefined;
  const levels = levelsIn(
    mounts.filter((m) => m.version === "v2"),
    unified.path,
    cgroupRoot,
  );
  return { version: "v2", path: unified.path, memory: levels, cpu: levels, cpuset: levels };
}
