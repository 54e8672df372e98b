#!/usr/bin/env node
/**
 * The container healthcheck: asks the service's own `grpc.health.v1.Health/Check` (Connect JSON
 * over HTTP/1.1, no token needed) and exits 0 only when it answers SERVING, 1 otherwise, within a
 * few seconds. Node's `http` only: the image carries no curl.
 *
 * Which service: the first argument, else what the entrypoint recorded in /tmp/berth-service, else
 * BERTH_SERVICE (`up` checks both). Where: BERTH_SESSIONS_SOCKET / BERTH_BUDGET_SOCKET when set,
 * else BERTH_HOST (a wildcard address is asked on loopback) and BERTH_SESSIONS_PORT /
 * BERTH_BUDGET_PORT, defaults 127.0.0.1, 7301 and 7302.
 */
import { readFileSync } from "node:fs";
import { request } from "node:http";

const TIMEOUT_MS = Number(process.env.BERTH_HEALTHCHECK_TIMEOUT_MS ?? 3000);

const DEFAULTS = {
  sessions: { port: 7301, portVar: "BERTH_SESSIONS_PORT", socketVar: "BERTH_SESSIONS_SOCKET" },
  budget: { port: 7302, portVar: "BERTH_BUDGET_PORT", socketVar: "BERTH_BUDGET_SOCKET" },
};

function chosenService() {
  if (process.argv[2]) return process.argv[2];
  try {
    const recorded = readFileSync("/tmp/berth-service", "utf8").trim();
    if (recorded) return recorded;
  } catch {
    // not recorded (read-only /tmp, or started without the entrypoint): the environment says
  }
  return process.env.BERTH_SERVICE || "sessions";
}

/** A listening address to dial: wildcards mean "every interface", so loopback answers. */
function dialHost() {
  const host = (process.env.BERTH_HOST || "127.0.0.1").replace(/^\[(.*)\]$/, "$1");
  if (host === "0.0.0.0") return "127.0.0.1";
  if (host === "::") return "::1";
  return host;
}

/** Resolves with the status the service reports, or rejects with why it could not be asked. */
function check(name) {
  const target = DEFAULTS[name];
  if (!target) return Promise.resolve({ name, where: "-", status: "UNKNOWN_SERVICE", error: "use sessions, budget or up" });
  const socketPath = process.env[target.socketVar] || undefined;
  const port = Number(process.env[target.portVar] || target.port);
  const body = "{}";
  return new Promise((resolve, reject) => {
    const req = request(
      {
        ...(socketPath ? { socketPath } : { host: dialHost(), port }),
        method: "POST",
        path: "/grpc.health.v1.Health/Check",
        headers: { "content-type": "application/json", "connect-protocol-version": "1", "content-length": Buffer.byteLength(body) },
        timeout: TIMEOUT_MS,
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk) => (text += chunk));
        res.on("end", () => {
          if (res.statusCode !== 200) return reject(new Error(`HTTP ${res.statusCode}: ${text.slice(0, 200)}`));
          try {
            resolve(JSON.parse(text).status ?? "UNKNOWN");
          } catch {
            reject(new Error(`not JSON: ${text.slice(0, 200)}`));
          }
        });
      },
    );
    req.on("timeout", () => req.destroy(new Error(`no answer within ${TIMEOUT_MS} ms`)));
    req.on("error", reject);
    req.end(body);
  }).then(
    (status) => ({ name, where: socketPath ?? `${dialHost()}:${port}`, status }),
    (error) => ({ name, where: socketPath ?? `${dialHost()}:${port}`, status: "UNREACHABLE", error: error.message }),
  );
}

const service = chosenService();
const results = await Promise.all((service === "up" ? ["sessions", "budget"] : [service]).map(check));
for (const r of results) console.log(`${r.name} at ${r.where}: ${r.status}${r.error ? ` (${r.error})` : ""}`);
process.exit(results.every((r) => r.status === "SERVING") ? 0 : 1);
