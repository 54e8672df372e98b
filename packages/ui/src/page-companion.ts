/**
 * `berth up --ui`: the live page served beside the services, in their process. Its settings join
 * theirs (`--ui`, `--ui-port`, with BERTH_* variables and the config file), and the services allow
 * its origins.
 */
import { parseBoolean, parsePort, type ConfigDefinition } from "@berth/shared/config";
import type { Companion, RunningServer } from "@berth/shared/server/index";
import { DEFAULT_PAGE_PORT, servePage, type PageServices } from "./serve-page.js";

const settings = {
  ui: {
    flag: "ui",
    env: "BERTH_UI",
    boolean: true,
    default: false,
    parse: parseBoolean,
    doc: "serve the live page too (sessions, locks, budget in a browser) on loopback, its origins allowed",
  },
  uiPort: {
    flag: "ui-port",
    env: "BERTH_UI_PORT",
    default: DEFAULT_PAGE_PORT,
    parse: parsePort,
    doc: "TCP port of the live page (with --ui; 0 picks a free one)",
  },
} satisfies ConfigDefinition;

/** The live page as `runServices` starts it beside the services. */
export const pageCompanion: Companion<typeof settings> = {
  settings,
  async start(values, servers) {
    if (!values.ui) return undefined;
    // The budget keeps a fleet view on etcd only (the store's setting is the services').
    const fleet = (values as Record<string, unknown>)["store"] === "etcd";
    // The services start after the page (their allow-lists name its origins): their URLs are read when asked.
    return servePage({ host: "127.0.0.1", port: values.uiPort, services: () => pageServices(servers()), fleet: () => fleet });
  },
};

/** Where the page finds the services: what each listens on. */
function pageServices(servers: readonly RunningServer[]): PageServices {
  const url = (name: string) => servers.find((server) => server.name === name)?.url ?? "";
  return { sessionsUrl: url("sessions"), budgetUrl: url("budget") };
}
