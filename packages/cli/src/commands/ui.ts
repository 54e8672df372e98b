/**
 * `berth ui`: the live page of the running services, served on loopback. The page calls the
 * services itself from the browser, so they must allow its origin (`--cors-origin`): this command
 * asks each one as a browser would (a preflight) and says what to change when one does not.
 * `berth up --ui` serves the same page beside the services, their allow-list already set.
 */
import { stringFlag, usageError, UsageError, type FlagSpec } from "../args.js";
import { servicesCommandLine, type Endpoint } from "../run/endpoint-flags.js";
import { EXIT, type Command } from "../command.js";
import { DEFAULT_BUDGET_URL, DEFAULT_SESSIONS_URL } from "../common-help.js";
import { renderHelp } from "../help.js";

const HELP = renderHelp({
  usage: ["berth ui [flags]"],
  about:
    "Serves berth's live page on 127.0.0.1 (port 7300 unless --ui-port says): every session live and a session's timeline, " +
    "the locks with their holders, waiters and leases, the budget's machine as charts, its queue with places, ETAs and " +
    "reasons, the reservations and running work, and on etcd the fleet. The page calls the services from the browser: " +
    "they must allow its origin (berth up --cors-origin http://127.0.0.1:7300,http://localhost:7300), or run " +
    "'berth up --ui', which serves the page itself with its origins allowed.",
  flags: [
    ["--ui-port PORT", "the page's port (else BERTH_UI_PORT; default 7300; 0 picks a free one)"],
    [
      "--sessions-url URL",
      `the sessions service (else BERTH_SESSIONS_URL, BERTH_HOST and BERTH_SESSIONS_PORT; default ${DEFAULT_SESSIONS_URL}); http only: a page cannot reach a unix socket`,
    ],
    ["--budget-url URL", `the budget service (else BERTH_BUDGET_URL, BERTH_HOST and BERTH_BUDGET_PORT; default ${DEFAULT_BUDGET_URL})`],
    [
      "--token-file FILE",
      "the services' bearer token (else BERTH_TOKEN_FILE, then BERTH_TOKEN): on a terminal, the page's address carries it in its #fragment",
    ],
    ["--help, -h", "this help"],
  ],
  notes:
    "The token never reaches this command's server: it travels in the address's fragment, which the browser keeps to " +
    "itself, and the page keeps it for its tab only. Without one the page asks for it when a service wants it. Ctrl-C stops serving.",
  exitCodes: [
    [String(EXIT.failed), "could not serve (the port is taken)"],
    [String(EXIT.usage), "wrong flags, or a service URL a page cannot call"],
  ],
  examples: [
    "berth ui",
    "berth ui --ui-port 8080",
    "BERTH_TOKEN_FILE=~/.config/berth/token berth ui",
    "berth up --ui    # the services and the page in one process",
  ],
});

/** Its own flags; the services' are every such command's (`servicesCommandLine`). */
const FLAGS: Readonly<Record<string, FlagSpec>> = { "ui-port": { type: "string" } };

/** `berth ui`. */
export const uiCommand: Command = {
  name: "ui",
  help: HELP,
  async run(argv) {
    let sessions: Endpoint;
    let budget: Endpoint;
    let port: number;
    try {
      const { endpoints, values } = servicesCommandLine(argv, FLAGS);
      ({ sessions, budget } = endpoints);
      for (const endpoint of [sessions, budget]) {
        if (!endpoint.url.startsWith("http:")) throw new UsageError(`--${endpoint.service}-url: a page calls http://HOST:PORT, not ${endpoint.url}`);
      }
      port = portOf(stringFlag(values, "ui-port") ?? process.env["BERTH_UI_PORT"]);
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError("berth ui", error.message);
    }
    const { servePage } = await import("@berth/ui/serve-page");
    let page;
    try {
      page = await servePage({ port, services: { sessionsUrl: sessions.url, budgetUrl: budget.url }, fleet: () => keepsFleet(budget) });
    } catch (error) {
      process.stderr.write(`berth ui: ${(error as Error).message}\n`);
      return EXIT.failed;
    }
    const token = sessions.token ?? budget.token;
    const address = token !== undefined && process.stdout.isTTY ? `${page.url}#token=${encodeURIComponent(token)}` : page.url;
    process.stdout.write(`berth ui: the live page is at ${address}\n`);
    for (const endpoint of [sessions, budget]) {
      const refusal = await originRefusal(endpoint.url, page.origins[0]!);
      if (refusal !== undefined) process.stderr.write(`berth ui: ${endpoint.service} at ${endpoint.url}: ${refusal}\n`);
    }
    const stop = () => void page.close().then(() => process.exit(EXIT.ok));
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
    return "serving";
  },
};

/** Whether the budget keeps a fleet view (it runs on etcd), asked again for each page that loads. */
async function keepsFleet(budget: Endpoint): Promise<boolean> {
  const { BudgetClient } = await import("@berth/client");
  try {
    await new BudgetClient({ url: budget.url, token: budget.token }).rpc.getFleet({ pageSize: 1 }, { timeoutMs: 2000 });
    return true;
  } catch {
    // FLEET_NEEDS_ETCD, or the budget is not up yet: the page shows one machine.
    return false;
  }
}

function portOf(raw: string | undefined): number {
  if (raw === undefined) return 7300;
  const port = Number(raw);
  if (!/^\d+$/.test(raw) || port > 65535) throw new UsageError(`--ui-port: a port is 0 to 65535, got ${JSON.stringify(raw)}`);
  return port;
}

/**
 * Whether the service at `url` lets a page of `origin` call it, asked as the browser will (a
 * CORS preflight of a Connect call); undefined when it does, else what to do about it.
 */
async function originRefusal(url: string, origin: string): Promise<string | undefined> {
  try {
    const response = await fetch(`${url}/grpc.health.v1.Health/Check`, {
      method: "OPTIONS",
      headers: { origin, "access-control-request-method": "POST", "access-control-request-headers": "content-type" },
      signal: AbortSignal.timeout(3000),
    });
    if (response.headers.get("access-control-allow-origin") === origin) return undefined;
    return `does not allow the page's origin: start it with --cors-origin ${origin},${origin.replace("127.0.0.1", "localhost")} (or BERTH_CORS_ORIGINS), or run 'berth up --ui'`;
  } catch {
    return "not reachable now; the page connects once it is up";
  }
}
