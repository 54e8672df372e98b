import * as http from "node:http";
import * as http2 from "node:http2";
import { afterEach, describe, expect, it } from "vitest";
import pino from "pino";
import { CORS_ALLOWED_HEADERS, CORS_EXPOSED_HEADERS } from "./cors.js";
import { startServer, type RunningServer } from "./start-server.js";

const PAGE = "http://localhost:3000";
const servers: RunningServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close(false)));
});

async function serve(options: { corsOrigins?: readonly string[]; token?: string } = {}) {
  const server = await startServer({ name: "test", logger: pino({ level: "silent" }), ...options });
  servers.push(server);
  return server.url;
}

interface Answer {
  readonly status: number;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: string;
}

/** One request over HTTP/1.1. */
function ask1(url: string, method: string, path: string, headers: Record<string, string>, body?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const request = http.request(new URL(path, url), { method, headers, agent: false }, (response) => {
      let text = "";
      response.setEncoding("utf8");
      response.on("data", (chunk: string) => (text += chunk));
      response.on("end", () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body: text }));
    });
    request.on("error", reject);
    request.end(body);
  });
}

/** One request over HTTP/2 (cleartext, prior knowledge). */
function ask2(url: string, method: string, path: string, headers: Record<string, string>, body?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(url);
    session.on("error", reject);
    const stream = session.request({ ":method": method, ":path": path, ...headers });
    let responseHeaders: http2.IncomingHttpHeaders = {};
    let text = "";
    stream.setEncoding("utf8");
    stream.on("response", (h) => (responseHeaders = h));
    stream.on("data", (chunk: string) => (text += chunk));
    stream.on("end", () => {
      session.close();
      resolve({ status: Number(responseHeaders[":status"]), headers: responseHeaders, body: text });
    });
    stream.on("error", reject);
    stream.end(body);
  });
}

const preflight = (origin: string, method = "POST") => ({
  origin,
  "access-control-request-method": method,
  "access-control-request-headers": "authorization,connect-protocol-version,content-type",
});
const check = { path: "/grpc.health.v1.Health/Check", headers: { "content-type": "application/json" }, body: "{}" };

for (const [wire, ask] of [
  ["HTTP/1.1", ask1],
  ["HTTP/2", ask2],
] as const) {
  describe(`CORS over ${wire}`, () => {
    it("answers an allowed origin's preflight with the methods and headers Connect, gRPC-Web and the token need, never *", async () => {
      const url = await serve({ corsOrigins: [PAGE] });
      const answer = await ask(url, "OPTIONS", check.path, preflight(PAGE));
      expect(answer.status).toBe(204);
      expect(answer.headers["access-control-allow-origin"]).toBe(PAGE);
      expect(answer.headers["access-control-allow-credentials"]).toBeUndefined();
      expect(String(answer.headers["access-control-allow-methods"]).split(", ")).toEqual(expect.arrayContaining(["POST", "GET"]));
      const allowed = String(answer.headers["access-control-allow-headers"]).split(", ");
      expect(allowed).toEqual(expect.arrayContaining(["authorization", "content-type", "connect-protocol-version", "x-grpc-web", "connect-timeout-ms"]));
      expect(allowed).toEqual([...CORS_ALLOWED_HEADERS]);
      expect(answer.headers["access-control-max-age"]).toBe("7200");
      expect(answer.headers.vary).toBe("Origin");
    });

    it("lets an allowed origin's call through, with the headers a client must read exposed", async () => {
      const url = await serve({ corsOrigins: [PAGE, "http://127.0.0.1:5173"] });
      const answer = await ask(url, "POST", check.path, { ...check.headers, origin: PAGE }, check.body);
      expect(answer.status).toBe(200);
      expect(JSON.parse(answer.body)).toEqual({ status: "SERVING" });
      expect(answer.headers["access-control-allow-origin"]).toBe(PAGE);
      const exposed = String(answer.headers["access-control-expose-headers"]).split(", ");
      expect(exposed).toEqual(expect.arrayContaining(["grpc-status", "grpc-message", "grpc-status-details-bin", "berth-error-details"]));
      expect(exposed).toEqual([...CORS_EXPOSED_HEADERS]);
    });

    it("refuses any other origin's preflight and call with 403 and no CORS header, before the call runs", async () => {
      const url = await serve({ corsOrigins: [PAGE] });
      for (const answer of [
        await ask(url, "OPTIONS", check.path, preflight("http://evil.example")),
        await ask(url, "POST", check.path, { ...check.headers, origin: "http://evil.example" }, check.body),
        // Same scheme and host, another port: another origin.
        await ask(url, "POST", check.path, { ...check.headers, origin: "http://localhost:3001" }, check.body),
      ]) {
        expect(answer.status).toBe(403);
        expect(answer.headers["access-control-allow-origin"]).toBeUndefined();
        expect(answer.body).toMatch(/^origin http:\/\/[a-z.]+(:\d+)? is not allowed to call this service: start it with --cors-origin /);
        expect(answer.body).not.toContain("SERVING");
      }
    });

    it("allows no origin by default, not even the service's own address (a name rebound to loopback)", async () => {
      const url = await serve();
      const own = new URL(url).origin;
      expect((await ask(url, "OPTIONS", check.path, preflight(PAGE))).status).toBe(403);
      expect((await ask(url, "POST", check.path, { ...check.headers, origin: own }, check.body)).status).toBe(403);
    });

    it("serves calls without Origin (every client but a browser) as before", async () => {
      const url = await serve({ corsOrigins: [PAGE] });
      const answer = await ask(url, "POST", check.path, check.headers, check.body);
      expect(answer.status).toBe(200);
      expect(answer.headers["access-control-allow-origin"]).toBeUndefined();
    });

    it("lets a page read a refusal: a call without the token is answered unauthenticated with the CORS headers", async () => {
      const url = await serve({ corsOrigins: [PAGE], token: "s3cret" });
      // The preflight carries no token (browsers never send one): answered all the same.
      expect((await ask(url, "OPTIONS", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", preflight(PAGE))).status).toBe(204);
      const answer = await ask(
        url,
        "POST",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        { "content-type": "application/connect+json", origin: PAGE },
        "",
      );
      // A Connect stream: the error is its end-of-stream message.
      expect(answer.body).toContain('"code":"unauthenticated"');
      expect(answer.headers["access-control-allow-origin"]).toBe(PAGE);
    });

    it("allows a public page's call to loopback when its origin is allowed (Private Network Access)", async () => {
      const url = await serve({ corsOrigins: ["https://tools.example.com"] });
      const answer = await ask(url, "OPTIONS", check.path, { ...preflight("https://tools.example.com"), "access-control-request-private-network": "true" });
      expect(answer.status).toBe(204);
      expect(answer.headers["access-control-allow-private-network"]).toBe("true");
    });
  });
}
