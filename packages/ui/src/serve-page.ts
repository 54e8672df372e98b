/**
 * Serves the live page on loopback: its three files (read once, from dist/page/) and
 * `/config.json`, where the page finds the services' URLs. The page calls the services itself
 * from the browser (their CORS allow-list must name its origins, `pageOrigins`); this server only
 * hands out files, so it holds no token and proxies nothing.
 */
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";

/** The page's port unless told: one below the sessions service's 7301. */
export const DEFAULT_PAGE_PORT = 7300;

/** Where the services are: what the page calls, and all its CSP lets it call. */
export interface PageServices {
  readonly sessionsUrl: string;
  readonly budgetUrl: string;
}

/** What `/config.json` tells the page: where the services are, and whether to show the fleet. */
export interface PageConfig extends PageServices {
  /** Whether the budget keeps a fleet view (it runs on etcd): the page asks for it only then. */
  readonly fleet: boolean;
}

/** Options of {@link servePage}. */
export interface ServePageOptions {
  /** A loopback address: 127.0.0.1 (default), ::1 or localhost. */
  readonly host?: string | undefined;
  /** Default 7300; 0 picks a free one. */
  readonly port?: number | undefined;
  /** The services' URLs; a function when they are known only once the services listen (`berth up --ui` on port 0). */
  readonly services: PageServices | (() => PageServices);
  /**
   * Whether the budget keeps a fleet view, asked for each `/config.json` (a page's load) and for
   * nothing else: it may ask the budget itself. Default: no fleet.
   */
  readonly fleet?: (() => boolean | Promise<boolean>) | undefined;
  /** Where the built page is (default: this package's dist/page/). */
  readonly assetsDir?: string | undefined;
}

/** A running page server. */
export interface PageServer {
  /** `http://127.0.0.1:7300/`. */
  readonly url: string;
  /** The origins the page runs under: what the services must allow (`--cors-origin`). */
  readonly origins: readonly string[];
  close(): Promise<void>;
}

interface Asset {
  readonly body: Buffer;
  readonly type: string;
}

const LOOPBACK_HOSTS = new Set(["127.0.0.1", "::1", "localhost"]);

/** Reads the built page; throws naming the build step when it is missing. */
export function loadPageAssets(assetsDir = fileURLToPath(new URL("../dist/page/", import.meta.url))): ReadonlyMap<string, Asset> {
  const assets = new Map<string, Asset>();
  for (const [name, type] of [
    ["index.html", "text/html; charset=utf-8"],
    ["page.js", "text/javascript; charset=utf-8"],
    ["page.css", "text/css; charset=utf-8"],
  ] as const) {
    let body: Buffer;
    try {
      body = readFileSync(`${assetsDir}${name}`);
    } catch (error) {
      throw new Error(`the live page is not built (${assetsDir}${name}: ${(error as NodeJS.ErrnoException).code}): run npm run build`);
    }
    assets.set(`/${name === "index.html" ? "" : name}`, { body, type });
  }
  return assets;
}

/** The origins a page served at `host:port` runs under: both loopback names a person may type. */
export function pageOrigins(host: string, port: number): string[] {
  if (host === "::1") return [`http://[::1]:${port}`];
  return [`http://127.0.0.1:${port}`, `http://localhost:${port}`];
}

/** Starts serving the page; resolves once it listens. Refuses a host that is not loopback: the page is for the person at this machine. */
export async function servePage(options: ServePageOptions): Promise<PageServer> {
  const host = options.host ?? "127.0.0.1";
  if (!LOOPBACK_HOSTS.has(host)) throw new Error(`the live page is served on loopback only (127.0.0.1, ::1 or localhost), not ${host}`);
  const assets = loadPageAssets(options.assetsDir);
  const given = options.services;
  const services = typeof given === "function" ? given : () => given;
  const fleet = options.fleet ?? (() => false);
  let allowedHosts = new Set<string>();
  const server = createServer((request, response) => {
    answer(request, response).catch((error: unknown) => {
      if (!response.headersSent) plain(response, 500, `the page's server failed: ${error instanceof Error ? error.message : String(error)}\n`);
      else response.destroy();
    });
  });
  server.keepAliveTimeout = 5_000;

  async function answer(request: IncomingMessage, response: ServerResponse): Promise<void> {
    // A page on another site could reach a loopback port through a DNS name it controls
    // (rebinding): only requests that name this server as the browser typed it are answered.
    if (!allowedHosts.has(request.headers.host ?? "")) {
      plain(response, 421, "this page is served on loopback only: open it at 127.0.0.1 or localhost\n");
      return;
    }
    if (request.method !== "GET" && request.method !== "HEAD") {
      response.setHeader("allow", "GET, HEAD");
      plain(response, 405, "the page answers GET and HEAD only\n");
      return;
    }
    const path = (request.url ?? "/").split("?")[0]!;
    if (path === "/config.json") {
      const { sessionsUrl, budgetUrl } = services();
      const config: PageConfig = { sessionsUrl, budgetUrl, fleet: await fleet() };
      send(request, response, { body: Buffer.from(JSON.stringify(config)), type: "application/json" }, []);
      return;
    }
    const asset = assets.get(path);
    if (asset === undefined) {
      plain(response, 404, "not found: the page is at /\n");
      return;
    }
    const { sessionsUrl, budgetUrl } = services();
    send(request, response, asset, [sessionsUrl, budgetUrl]);
  }

  function send(request: IncomingMessage, response: ServerResponse, asset: Asset, connectTo: readonly string[]): void {
    response.setHeader("content-type", asset.type);
    response.setHeader("content-length", asset.body.length);
    response.setHeader("cache-control", "no-cache");
    response.setHeader("x-content-type-options", "nosniff");
    response.setHeader("referrer-policy", "no-referrer");
    response.setHeader(
      "content-security-policy",
      `default-src 'self'; connect-src 'self' ${connectTo.map(originOf).join(" ")}; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'`,
    );
    response.writeHead(200);
    response.end(request.method === "HEAD" ? undefined : asset.body);
  }

  const wanted = options.port ?? DEFAULT_PAGE_PORT;
  await new Promise<void>((resolve, reject) => {
    server.once("error", (error: NodeJS.ErrnoException) =>
      reject(new Error(`the live page cannot listen on ${host}:${wanted}: ${error.code ?? error.message} (--ui-port chooses another)`, { cause: error })),
    );
    server.listen({ host, port: wanted }, () => {
      server.removeAllListeners("error");
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const origins = pageOrigins(host, port);
  allowedHosts = new Set(origins.map((origin) => new URL(origin).host));
  return {
    url: `${origins[0]}/`,
    origins,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

function originOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "";
  }
}

function plain(response: ServerResponse, status: number, text: string): void {
  response.writeHead(status, { "content-type": "text/plain; charset=utf-8", "x-content-type-options": "nosniff" });
  response.end(text);
}
