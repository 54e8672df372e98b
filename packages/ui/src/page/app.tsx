/**
 * The page: a header with each service's link and the token form when one is needed, then the
 * sessions, locks, budget and fleet panels. A new token makes new clients: every panel starts
 * its watches again with it.
 */
import { Berth } from "@berth/client/web";
import { useCallback, useMemo, useState } from "preact/hooks";
import { BudgetPanel } from "./budget-panel.js";
import { FleetPanel } from "./fleet-panel.js";
import type { LinkState } from "./follow.js";
import { LocksPanel } from "./locks-panel.js";
import { SessionsPanel } from "./sessions-panel.js";
import { saveToken, type PageConfig } from "./settings.js";
import { describeLink } from "./timeline.js";

type Links = Readonly<Record<"sessions" | "locks" | "budget", LinkState>>;

const CONNECTING: LinkState = { kind: "connecting" };

export function App({ config, token: initialToken }: { readonly config: PageConfig; readonly token: string | undefined }) {
  const [token, setToken] = useState(initialToken);
  const berth = useMemo(() => new Berth({ sessionsUrl: config.sessionsUrl, budgetUrl: config.budgetUrl, token }), [config, token]);
  const [links, setLinks] = useState<Links>({ sessions: CONNECTING, locks: CONNECTING, budget: CONNECTING });
  const onSessions = useCallback((state: LinkState) => setLinks((links) => ({ ...links, sessions: state })), []);
  const onLocks = useCallback((state: LinkState) => setLinks((links) => ({ ...links, locks: state })), []);
  const onBudget = useCallback((state: LinkState) => setLinks((links) => ({ ...links, budget: state })), []);
  const needsToken = Object.values(links).some((link) => link.kind === "unauthenticated");

  return (
    <>
      <header>
        <a class="skip" href="#sessions">
          Skip to the sessions
        </a>
        <h1>berth</h1>
        <nav aria-label="Panels">
          <a href="#sessions">Sessions</a> <a href="#locks">Locks</a> <a href="#budget">Budget</a> <a href="#fleet">Fleet</a>
        </nav>
        <ul class="links" aria-label="Services" aria-live="polite">
          <LinkItem name="sessions" url={config.sessionsUrl} state={links.sessions} />
          <LinkItem name="locks" url={config.sessionsUrl} state={links.locks} />
          <LinkItem name="budget" url={config.budgetUrl} state={links.budget} />
        </ul>
      </header>
      {needsToken && (
        <TokenForm
          onToken={(given) => {
            saveToken(given);
            setLinks({ sessions: CONNECTING, locks: CONNECTING, budget: CONNECTING });
            setToken(given);
          }}
        />
      )}
      <main key={token ?? ""}>
        <SessionsPanel berth={berth} onLink={onSessions} />
        <LocksPanel berth={berth} onLink={onLocks} />
        <BudgetPanel berth={berth} onLink={onBudget} />
        <FleetPanel berth={berth} fleet={config.fleet} />
      </main>
    </>
  );
}

function LinkItem({ name, url, state }: { readonly name: string; readonly url: string; readonly state: LinkState }) {
  return (
    <li class={`link link-${state.kind}`} title={url}>
      <span class="dot" aria-hidden="true" />
      {name}: {describeLink(state)}
    </li>
  );
}

function TokenForm({ onToken }: { readonly onToken: (token: string) => void }) {
  const [value, setValue] = useState("");
  return (
    <form
      class="token-form"
      aria-label="Token"
      onSubmit={(event) => {
        event.preventDefault();
        if (value.trim() !== "") onToken(value.trim());
      }}
    >
      <p>The services need a token (the one they were started with: --token-file or BERTH_TOKEN). It is kept for this tab only.</p>
      <label>
        Token <input type="password" autocomplete="off" value={value} onInput={(event) => setValue(event.currentTarget.value)} />
      </label>
      <button type="submit">Use this token</button>
    </form>
  );
}
