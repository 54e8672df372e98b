/**
 * docker-compose.etcd.yml holds together: three etcd members that name one cluster (each member's
 * peer and client URLs are the ones the others and berth are given), two berth sessions instances
 * with `--store etcd` on every member and distinct ports, and, where docker-compose is installed
 * (CI installs it for the container test), `docker-compose config` accepts the file. Bringing the
 * stack up needs a Docker engine: test/container/run.sh validates the file there too.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { repoPath } from "./harness.js";

const FILE = repoPath("docker-compose.etcd.yml");
const text = readFileSync(FILE, "utf8");

/** The `KEY: value` lines of a top-level service's block (its own lines, anchors not expanded). */
function serviceBlock(name: string): string {
  const start = text.indexOf(`\n  ${name}:\n`);
  expect(start, `service ${name}`).toBeGreaterThan(0);
  const rest = text.slice(start + 1);
  const end = rest.slice(1).search(/\n {2}[a-z0-9-]+:\n|\nvolumes:\n/);
  return end < 0 ? rest : rest.slice(0, end + 1);
}

function value(block: string, key: string): string {
  const match = new RegExp(`^\\s+${key}: (.+)$`, "m").exec(block);
  expect(match, `${key} in\n${block}`).not.toBeNull();
  return match![1]!.trim();
}

describe("docker-compose.etcd.yml", () => {
  it("has three members of one cluster and two sessions instances on all three, on distinct ports", () => {
    const members = ["etcd1", "etcd2", "etcd3"].map((name) => {
      const block = serviceBlock(name);
      expect(block).toContain("<<: *etcd");
      expect(block).toContain("<<: *etcd-cluster");
      expect(value(block, "ETCD_NAME")).toBe(name);
      const client = value(block, "ETCD_LISTEN_CLIENT_URLS");
      expect(value(block, "ETCD_ADVERTISE_CLIENT_URLS")).toBe(client);
      const peer = value(block, "ETCD_LISTEN_PEER_URLS");
      expect(value(block, "ETCD_INITIAL_ADVERTISE_PEER_URLS")).toBe(peer);
      // The healthcheck asks this member, not another.
      expect(block).toContain(`"--endpoints=${client}"`);
      return { name, client, peer };
    });
    expect(new Set(members.flatMap((m) => [m.client, m.peer])).size).toBe(6);
    const cluster = value(text, "ETCD_INITIAL_CLUSTER");
    expect(cluster.split(",").sort()).toEqual(members.map((m) => `${m.name}=${m.peer}`).sort());
    expect(text).toContain("dockerfile: deploy/etcd.Dockerfile");

    expect(value(text, "BERTH_STORE")).toBe("etcd");
    expect(value(text, "BERTH_SERVICE")).toBe("sessions");
    expect(value(text, "BERTH_ETCD_ENDPOINTS").split(",")).toEqual(members.map((m) => m.client));
    const ports = ["berth-a", "berth-b"].map((name) => {
      const block = serviceBlock(name);
      expect(block).toContain("<<: *berth");
      expect(block).toContain("<<: *berth-environment");
      return value(block, "BERTH_SESSIONS_PORT");
    });
    expect(new Set(ports).size).toBe(2);
    // Both wait for every member to be healthy.
    for (const name of ["etcd1", "etcd2", "etcd3"]) expect(text).toMatch(new RegExp(`\\n {4}${name}:\\n {6}condition: service_healthy`));
  });

  it("installs Debian's etcd-server in the members' image, on the base the berth image builds on", () => {
    const dockerfile = readFileSync(repoPath("deploy/etcd.Dockerfile"), "utf8");
    const base = /^FROM (\S+)/m.exec(readFileSync(repoPath("Dockerfile"), "utf8"))![1];
    expect(dockerfile).toMatch(new RegExp(`^FROM ${base!.replace(/[.]/g, "\\.")}$`, "m"));
    expect(dockerfile).toMatch(/apt-get install -y --no-install-recommends etcd-server etcd-client/);
    expect(dockerfile).toMatch(/^USER etcd$/m);
  });

  it("is accepted by docker-compose config, where docker-compose is installed", () => {
    const found = spawnSync("docker-compose", ["version", "--short"], { encoding: "utf8" });
    if (found.error !== undefined) {
      // Without docker-compose only the checks above run; CI has it (the container test installs it).
      expect((found.error as NodeJS.ErrnoException).code).toBe("ENOENT");
      return;
    }
    const config = execFileSync("docker-compose", ["-f", FILE, "config"], { encoding: "utf8", env: { ...process.env, PWD: repoPath(".") } });
    for (const name of ["etcd1", "etcd2", "etcd3", "berth-a", "berth-b"]) expect(config).toMatch(new RegExp(`^ {2}${name}:$`, "m"));
    expect(config).toContain("BERTH_STORE: etcd");
  });
});
