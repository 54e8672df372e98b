/**
 * Where the page finds the services (`/config.json`, from the server that served it) and the
 * token it calls them with: from the URL's fragment (`#token=…`, which `berth ui` prints; a
 * fragment is never sent to a server), then from this tab's sessionStorage, then from the form
 * the page shows when a service says the token is missing or wrong.
 */
const TOKEN_KEY = "berth-token";

export interface PageConfig {
  readonly sessionsUrl: string;
  readonly budgetUrl: string;
  /** The budget keeps a fleet view (on etcd). */
  readonly fleet: boolean;
}

/** The services' URLs, as the page's server says. */
export async function loadConfig(): Promise<PageConfig> {
  const response = await fetch("/config.json", { cache: "no-store" });
  if (!response.ok) throw new Error(`the page's server answered ${response.status} for /config.json`);
  const config = (await response.json()) as Partial<PageConfig>;
  if (typeof config.sessionsUrl !== "string" || typeof config.budgetUrl !== "string") throw new Error("the page's server sent no service URLs");
  return { sessionsUrl: config.sessionsUrl, budgetUrl: config.budgetUrl, fleet: config.fleet === true };
}

/** The token: the fragment's (kept for this tab, then taken out of the address bar), or this tab's. */
export function initialToken(): string | undefined {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get("token");
  if (given !== null) {
    fragment.delete("token");
    const rest = fragment.toString();
    history.replaceState(null, "", `${location.pathname}${location.search}${rest === "" ? "" : `#${rest}`}`);
    saveToken(given);
  }
  return sessionStorage.getItem(TOKEN_KEY) ?? undefined;
}

/** Keeps the token for this tab (sessionStorage: it leaves with the tab). */
export function saveToken(token: string | undefined): void {
  if (token === undefined || token === "") sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, token);
}
