/**
 * The browser entry without a browser: what it imports (nothing of Node, whatever a module of its
 * graph is), what it refuses before sending anything (a stream both ways, a relative lock path),
 * how it names a page's tab and reads a page's options, and how a fetch that found nothing reads.
 */
import { readFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { Code, createRouterTransport } from "@connectrpc/connect";
import { LockService, type InspectRequest } from "@berth/api/berth/locks/v1/lock_service_pb";
import { describe, expect, it } from "vitest";
import { start } from "./budget-base.js";
import { BerthClientError } from "./errors.js";
import { uuidFromRandomBytes } from "./request-ids.js";
import { Berth, BudgetClient, EndpointError, LocksClient, SessionsClient, browserOf, pageOwner, webEndpoint } from "./web.js";

const SRC = new URL("./", import.meta.url);

/** The modules `entry` loads at run time (type-only imports left out), by file name, with what each imports from outside. */
function runtimeGraph(entry: string): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  const pending = [entry];
  while (pending.length > 0) {
    const file = pending.pop()!;
    if (graph.has(file)) continue;
    const source = readFileSync(new URL(file, SRC), "utf8");
    const outside: string[] = [];
    for (const [, kind, spec] of source.matchAll(/^(?:import|export)\s+(type\s+)?(?:[^;]*?\bfrom\s+)?"([^"]+)";/gms)) {
      if (kind !== undefined) continue;
      if (spec!.startsWith("./")) pending.push(spec!.replace(/\.js$/, ".ts").slice(2));
      else outside.push(spec!);
    }
    graph.set(file, outside);
  }
  return graph;
}

/** `source` without its comments, for looking for globals it uses. */
function code(source: string): string {
  return source.replace(/\/\*[\s\S]*?\*\//g, "").replace(/(^|[^:"'`])\/\/.*$/gm, "$1");
}

describe("the browser entry's module graph", () => {
  const graph = runtimeGraph("web.ts");

  it("holds the platform-free clients and the page's connection, none of the Node entry's modules", () => {
    expect([...graph.keys()]).toEqual(expect.arrayContaining(["sessions-base.ts", "locks-base.ts", "budget-base.ts", "web-connection.ts", "web-transport.ts"]));
    for (const nodeOnly of [
      "index.ts",
      "endpoint.ts",
      "transport.ts",
      "owner.ts",
      "lock-path.ts",
      "node-connection.ts",
      "sessions.ts",
      "locks.ts",
      "budget.ts",
    ]) {
      expect(graph.has(nodeOnly), `web.ts loads ${nodeOnly}`).toBe(false);
    }
  });

  it("imports no Node built-in and no connect-node, and uses no Node global", () => {
    const outside = new Set([...graph.values()].flat());
    expect([...outside].filter((spec) => spec.startsWith("node:") || builtinModules.includes(spec) || spec.includes("connect-node"))).toEqual([]);
    expect(outside).toContain("@connectrpc/connect-web");
    for (const file of graph.keys()) {
      const used = code(readFileSync(new URL(file, SRC), "utf8")).match(/\b(?:process|Buffer|require|__dirname|setImmediate)\b(?:\.\w+)?/g);
      expect(used, `${file} uses a Node global`).toBeNull();
    }
  });

  it("sees what the Node entry loads, so that an absence above means something", () => {
    const node = runtimeGraph("index.ts");
    expect(node.has("endpoint.ts") && node.has("node-connection.ts")).toBe(true);
    expect(new Set([...node.values()].flat())).toContain("node:fs");
  });
});

describe("a page's options", () => {
  it("the default addresses, an explicit URL and token; an address a page cannot call is an EndpointError", () => {
    expect(webEndpoint("sessions")).toEqual({
      service: "sessions",
      url: "http://127.0.0.1:7301",
      urlSource: "default",
      token: undefined,
      tokenSource: undefined,
    });
    expect(webEndpoint("budget", { url: "http://localhost:9000/", token: "t", interceptors: [] })).toEqual({
      service: "budget",
      url: "http://localhost:9000",
      urlSource: "option",
      token: "t",
      tokenSource: "option",
    });
    expect(() => new SessionsClient({ url: "unix:/run/berth.sock" })).toThrow(EndpointError);
    expect(() => new Berth({ budgetUrl: "127.0.0.1:7302" }).budget).toThrow(/the budget URL must look like http:\/\/127\.0\.0\.1:7302/);
    expect(new Berth({ sessionsUrl: " ", token: "" }).sessions.endpoint).toMatchObject({
      url: "http://127.0.0.1:7301",
      urlSource: "default",
      token: undefined,
    });
  });

  it("names the tab by its browser and origin", () => {
    const chrome = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
    expect(browserOf(chrome)).toBe("Chrome 131");
    expect(browserOf(chrome.replace("Chrome/", "HeadlessChrome/"))).toBe("HeadlessChrome 131");
    expect(browserOf(`${chrome} Edg/131.0.2903.86`)).toBe("Edge 131");
    expect(browserOf("Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0")).toBe("Firefox 133");
    expect(browserOf("Mozilla/5.0 (Macintosh; Intel Mac OS X 14_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15")).toBe("Safari 18");
    expect(browserOf("Node.js/22")).toBeUndefined();
    // Node has no page: no location, and no browser in navigator.userAgent (where there is one).
    expect(pageOwner()).toBe("browser tab");
  });
});

describe("what a page cannot do, refused before anything is sent", () => {
  // Nothing listens on port 9: a call that went out would fail UNAVAILABLE, not as below.
  const nowhere = "http://127.0.0.1:9";

  it("admit: UNIMPLEMENTED BIDI_STREAM_UNSUPPORTED naming Reserve, at once, the work never run", async () => {
    let ran = false;
    const refused = await new BudgetClient({ url: nowhere }).admit([start("web")], () => (ran = true), { resumeWithinMs: 60_000 }).catch((e: unknown) => e);
    expect(ran).toBe(false);
    expect(refused).toBeInstanceOf(BerthClientError);
    expect(refused).toMatchObject({
      code: Code.Unimplemented,
      reason: "BIDI_STREAM_UNSUPPORTED",
      errorInfo: { domain: "berth.client", metadata: { method: "berth.budget.v1.BudgetService/Admit", instead: "Reserve" } },
    });
    expect((refused as Error).message).toMatch(/use reserve\(\) instead/);
  });

  it("a KeepAliveStream on rpc: the same, naming KeepAlive", async () => {
    const locks = new LocksClient({ url: nowhere });
    const refused = await (async () => {
      for await (const _ of locks.rpc.keepAliveStream((async function* () {})())) return undefined;
    })().catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: Code.Unimplemented, reason: "BIDI_STREAM_UNSUPPORTED", errorInfo: { metadata: { instead: "KeepAlive" } } });
  });

  it("a relative lock path without cwd: INVALID_ARGUMENT naming the field; with cwd, joined; an absolute one as it is", async () => {
    const seen: InspectRequest[] = [];
    const transport = createRouterTransport((router) =>
      router.service(LockService, {
        inspect(request) {
          seen.push(request);
          return {};
        },
      }),
    );
    const locks = new LocksClient({ transport });
    const refused = await locks.inspect("src/app.css").catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: Code.InvalidArgument, reason: "INVALID_FIELD", badRequest: { fieldViolations: [{ field: "file" }] } });
    expect((refused as Error).message).toMatch(/a page has no working directory/);
    await expect(locks.lock("src/app.css")).rejects.toMatchObject({ code: Code.InvalidArgument });
    await locks.inspect("src/app.css", { cwd: "/home/me/proj" });
    await locks.inspect("/srv/app.css");
    expect(seen.map((request) => request.file)).toEqual(["/home/me/proj/src/app.css", "/srv/app.css"]);
  });
});

describe("a service a page cannot reach", () => {
  it("is UNAVAILABLE FETCH_FAILED, naming the URL and what fetch said", async () => {
    const url = "http://127.0.0.1:9";
    const failed = await new SessionsClient({ url }).snapshot("s").catch((e: unknown) => e);
    expect(failed).toMatchObject({ code: Code.Unavailable, reason: "FETCH_FAILED", errorInfo: { metadata: { url } } });
    expect((failed as Error).message).toMatch(/cannot reach http:\/\/127\.0\.0\.1:9: nothing answered there \(fetch failed/);
  });
});

describe("request ids where crypto.randomUUID is missing (a page that is no secure context)", () => {
  it("are version 4 UUIDs all the same", () => {
    const ids = new Set(Array.from({ length: 100 }, uuidFromRandomBytes));
    expect(ids.size).toBe(100);
    for (const id of ids) expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  });
});
