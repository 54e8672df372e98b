import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { loadPageAssets, pageOrigins, servePage, type PageServer } from "./serve-page.js";

/** A built page of three small files. */
function assets(): string {
  const dir = path.join(mkdtempSync(path.join(tmpdir(), "berth-page-")), "page") + path.sep;
  mkdirSync(dir);
  writeFileSync(`${dir}index.html`, "<!doctype html><title>berth</title>");
  writeFileSync(`${dir}page.js`, "console.log(1)");
  writeFileSync(`${dir}page.css`, "body{}");
  return dir;
}

const SERVICES = { sessionsUrl: "http://127.0.0.1:7301", budgetUrl: "http://127.0.0.1:7302", fleet: false };

let server: PageServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

/** A request with the Host header given (fetch may not set it). */
function get(url: string, options: { host?: string; method?: string; path?: string } = {}) {
  const target = new URL(url);
  return new Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: string }>((resolve, reject) => {
    const req = request(
      { host: target.hostname, port: target.port, path: options.path ?? "/", method: options.method ?? "GET", headers: { host: options.host ?? target.host } },
      (res) => {
        let body = "";
        res.setEncoding("utf8").on("data", (chunk: string) => (body += chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      },
    );
    req.on("error", reject);
    req.end();
  });
}

describe("servePage", () => {
  it("serves the page's three files with their types and a CSP that lets it call only the two services", async () => {
    server = await servePage({ port: 0, services: SERVICES, assetsDir: assets() });
    const page = await get(server.url);
    expect(page.status).toBe(200);
    expect(page.headers["content-type"]).toBe("text/html; charset=utf-8");
    expect(page.headers["x-content-type-options"]).toBe("nosniff");
    expect(page.headers["content-security-policy"]).toContain("connect-src 'self' http://127.0.0.1:7301 http://127.0.0.1:7302;");
    expect(page.headers["content-security-policy"]).toContain("default-src 'self'");
    expect((await get(server.url, { path: "/page.js" })).headers["content-type"]).toBe("text/javascript; charset=utf-8");
    expect((await get(server.url, { path: "/page.css" })).body).toBe("body{}");
    expect((await get(server.url, { path: "/page.js", method: "HEAD" })).body).toBe("");
  });

  it("tells the page where the services are, asked again for each load", async () => {
    let fleet = false;
    server = await servePage({ port: 0, services: SERVICES, fleet: async () => fleet, assetsDir: assets() });
    expect(JSON.parse((await get(server.url, { path: "/config.json" })).body)).toEqual(SERVICES);
    fleet = true;
    expect(JSON.parse((await get(server.url, { path: "/config.json" })).body)).toMatchObject({ fleet: true });
  });

  it("asks whether there is a fleet once per /config.json, never for the page's files", async () => {
    let probes = 0;
    server = await servePage({
      port: 0,
      services: SERVICES,
      fleet: () => {
        probes++;
        return true;
      },
      assetsDir: assets(),
    });
    for (const p of ["/", "/page.js", "/page.css"]) expect((await get(server.url, { path: p })).status).toBe(200);
    expect((await get(server.url, { path: "/page.js", method: "HEAD" })).status).toBe(200);
    expect(probes).toBe(0);
    expect(JSON.parse((await get(server.url, { path: "/config.json" })).body)).toMatchObject({ fleet: true });
    expect(probes).toBe(1);
    await get(server.url, { path: "/config.json" });
    expect(probes).toBe(2);
  });

  it("reads the services' URLs when asked, for a page served before the services listen", async () => {
    let services = { sessionsUrl: "", budgetUrl: "" };
    server = await servePage({ port: 0, services: () => services, assetsDir: assets() });
    services = { sessionsUrl: SERVICES.sessionsUrl, budgetUrl: SERVICES.budgetUrl };
    expect(JSON.parse((await get(server.url, { path: "/config.json" })).body)).toEqual(SERVICES);
    expect((await get(server.url)).headers["content-security-policy"]).toContain("connect-src 'self' http://127.0.0.1:7301 http://127.0.0.1:7302;");
  });

  it("answers only requests addressed to it by a loopback name: another name (a rebound DNS name) gets 421", async () => {
    server = await servePage({ port: 0, services: SERVICES, assetsDir: assets() });
    const port = new URL(server.url).port;
    expect((await get(server.url, { host: `localhost:${port}` })).status).toBe(200);
    const rebound = await get(server.url, { host: `attacker.example:${port}`, path: "/config.json" });
    expect(rebound.status).toBe(421);
    expect(rebound.body).not.toContain("7301");
  });

  it("serves nothing else: other paths 404 (no file outside the page is reachable), other methods 405", async () => {
    server = await servePage({ port: 0, services: SERVICES, assetsDir: assets() });
    for (const p of ["/../package.json", "/%2e%2e/package.json", "/index.html/..", "/nope"]) expect((await get(server.url, { path: p })).status).toBe(404);
    const post = await get(server.url, { method: "POST" });
    expect(post.status).toBe(405);
    expect(post.headers["allow"]).toBe("GET, HEAD");
  });

  it("names its origins (what the services must allow), and listens on loopback only", async () => {
    server = await servePage({ port: 0, services: SERVICES, assetsDir: assets() });
    const port = Number(new URL(server.url).port);
    expect(server.origins).toEqual([`http://127.0.0.1:${port}`, `http://localhost:${port}`]);
    expect(pageOrigins("::1", 7300)).toEqual(["http://[::1]:7300"]);
    await expect(servePage({ host: "0.0.0.0", port: 0, services: SERVICES, assetsDir: assets() })).rejects.toThrow(/loopback only/);
  });

  it("says which flag to change when its port is taken, and what to run when the page is not built", async () => {
    server = await servePage({ port: 0, services: SERVICES, assetsDir: assets() });
    const port = Number(new URL(server.url).port);
    await expect(servePage({ port, services: SERVICES, assetsDir: assets() })).rejects.toThrow(
      `cannot listen on 127.0.0.1:${port}: EADDRINUSE (--ui-port chooses another)`,
    );
    expect(() => loadPageAssets(path.join(tmpdir(), "no-such-page") + path.sep)).toThrow(/not built .*npm run build/);
  });
});
