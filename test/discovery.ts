/**
 * How every client finds the services and its token (the table of docs/clients.md), as cases: an
 * environment and explicit settings, and what a client must resolve from them. The CLI's own
 * resolution is checked against them in client-discovery.test.ts, each other client's in its test
 * file (python.test.ts, go.test.ts), so a client that strays from the table fails on the row it
 * breaks.
 */
import { writeFileSync } from "node:fs";
import * as path from "node:path";
import { expect } from "vitest";
import { endpointFromFlags } from "@berth/cli/run/endpoint-flags";

/** What a client resolved: both URLs and the token (null without one), or the error it gave. */
export type Resolution = { sessions: string; budget: string; token: string | null } | { error: string };

/** One case, in the shape the clients' resolvers read it (snake case: Python's and Go's JSON). */
export interface DiscoveryCase {
  /** The rule of the table it checks. */
  readonly name: string;
  readonly env: Readonly<Record<string, string>>;
  readonly sessions_url?: string;
  readonly budget_url?: string;
  /** An explicit token: the berth command takes none (only a token file), so its rows skip the CLI. */
  readonly token?: string;
  readonly token_file?: string;
  /** The resolution, with an error as a pattern its message must match. */
  readonly expected: { sessions: string; budget: string; token: string | null } | { error: RegExp };
}

const DEFAULTS = { sessions: "http://127.0.0.1:7301", budget: "http://127.0.0.1:7302" };

/** The cases, with their token files written in `dir`. */
export function discoveryCases(dir: string): DiscoveryCase[] {
  const file = (name: string, content: string) => {
    const target = path.join(dir, name);
    writeFileSync(target, content, { mode: 0o600 });
    return target;
  };
  const fromFlag = file("flag-token", "from-flag\n");
  const fromEnv = file("env-token", "  from-env-file \n");
  const empty = file("empty-token", "\n");
  const missing = path.join(dir, "no-such-token");
  const all = {
    BERTH_SESSIONS_URL: "http://10.0.0.1:1",
    BERTH_BUDGET_URL: "http://10.0.0.1:2",
    BERTH_SESSIONS_SOCKET: "/run/s.sock",
    BERTH_BUDGET_SOCKET: "/run/b.sock",
    BERTH_HOST: "10.0.0.2",
    BERTH_SESSIONS_PORT: "3",
    BERTH_BUDGET_PORT: "4",
  };
  return [
    { name: "nothing set: the defaults, no token", env: {}, expected: { ...DEFAULTS, token: null } },
    {
      name: "an explicit URL wins over every variable",
      env: all,
      sessions_url: "http://127.0.0.1:9001",
      budget_url: "unix:/tmp/budget.sock",
      expected: { sessions: "http://127.0.0.1:9001", budget: "unix:/tmp/budget.sock", token: null },
    },
    { name: "BERTH_*_URL wins over sockets, host and ports", env: all, expected: { sessions: "http://10.0.0.1:1", budget: "http://10.0.0.1:2", token: null } },
    {
      name: "BERTH_*_SOCKET wins over host and ports",
      env: { ...all, BERTH_SESSIONS_URL: "", BERTH_BUDGET_URL: "" },
      expected: { sessions: "unix:/run/s.sock", budget: "unix:/run/b.sock", token: null },
    },
    {
      name: "BERTH_HOST with BERTH_*_PORT",
      env: { BERTH_HOST: "10.0.0.2", BERTH_SESSIONS_PORT: "3", BERTH_BUDGET_PORT: "4" },
      expected: { sessions: "http://10.0.0.2:3", budget: "http://10.0.0.2:4", token: null },
    },
    {
      name: "BERTH_HOST alone: the default ports",
      env: { BERTH_HOST: "localhost" },
      expected: { sessions: "http://localhost:7301", budget: "http://localhost:7302", token: null },
    },
    {
      name: "a port alone: on 127.0.0.1, the other service on its default",
      env: { BERTH_SESSIONS_PORT: "8001" },
      expected: { sessions: "http://127.0.0.1:8001", budget: DEFAULTS.budget, token: null },
    },
    {
      name: "BERTH_HOST=0.0.0.0 is reached on 127.0.0.1",
      env: { BERTH_HOST: "0.0.0.0", BERTH_BUDGET_PORT: "8002" },
      expected: { sessions: DEFAULTS.sessions, budget: "http://127.0.0.1:8002", token: null },
    },
    {
      name: "BERTH_HOST=:: is reached on 127.0.0.1",
      env: { BERTH_HOST: "::", BERTH_SESSIONS_PORT: "8003" },
      expected: { sessions: "http://127.0.0.1:8003", budget: DEFAULTS.budget, token: null },
    },
    {
      name: "an IPv6 BERTH_HOST is bracketed",
      env: { BERTH_HOST: "::1" },
      expected: { sessions: "http://[::1]:7301", budget: "http://[::1]:7302", token: null },
    },
    {
      name: "a blank variable counts as unset",
      env: { BERTH_SESSIONS_URL: "  ", BERTH_SESSIONS_SOCKET: "", BERTH_HOST: " ", BERTH_TOKEN: " " },
      expected: { ...DEFAULTS, token: null },
    },
    {
      name: "trailing slashes are dropped",
      env: { BERTH_SESSIONS_URL: "http://127.0.0.1:9003//" },
      budget_url: "http://127.0.0.1:9004/",
      expected: { sessions: "http://127.0.0.1:9003", budget: "http://127.0.0.1:9004", token: null },
    },
    {
      name: "a URL that is neither http(s):// nor unix: is refused",
      env: { BERTH_BUDGET_URL: "127.0.0.1:7302" },
      expected: { error: /BERTH_BUDGET_URL must look like http:\/\/127\.0\.0\.1:730[12] or unix:\/path\/to\/socket, got "127\.0\.0\.1:7302"/ },
    },
    {
      name: "an explicit token wins over token files and BERTH_TOKEN",
      env: { BERTH_TOKEN_FILE: fromEnv, BERTH_TOKEN: "from-env" },
      token: "explicit",
      token_file: fromFlag,
      expected: { ...DEFAULTS, token: "explicit" },
    },
    {
      name: "an explicit token file wins over BERTH_TOKEN_FILE and BERTH_TOKEN",
      env: { BERTH_TOKEN_FILE: fromEnv, BERTH_TOKEN: "from-env" },
      token_file: fromFlag,
      expected: { ...DEFAULTS, token: "from-flag" },
    },
    {
      name: "BERTH_TOKEN_FILE (trimmed) wins over BERTH_TOKEN",
      env: { BERTH_TOKEN_FILE: fromEnv, BERTH_TOKEN: "from-env" },
      expected: { ...DEFAULTS, token: "from-env-file" },
    },
    { name: "BERTH_TOKEN alone", env: { BERTH_TOKEN: "from-env" }, expected: { ...DEFAULTS, token: "from-env" } },
    {
      name: "an empty token file is refused",
      env: { BERTH_TOKEN_FILE: empty, BERTH_TOKEN: "from-env" },
      expected: { error: /the token file .*empty-token is empty/ },
    },
    {
      name: "a token file that cannot be read is refused",
      env: { BERTH_TOKEN: "from-env" },
      token_file: missing,
      expected: { error: /cannot read the token file .*no-such-token/ },
    },
  ];
}

/** What the berth command resolves for a case (its flags: `--sessions-url`, `--budget-url`, `--token-file`). */
export function cliResolution(c: DiscoveryCase): Resolution {
  try {
    const flags = { "sessions-url": c.sessions_url, "budget-url": c.budget_url, "token-file": c.token_file };
    const [sessions, budget] = withEnvironment(c.env, () => [endpointFromFlags("sessions", flags), endpointFromFlags("budget", flags)]);
    return { sessions: sessions.url, budget: budget.url, token: sessions.token ?? null };
  } catch (error) {
    return { error: (error as Error).message };
  }
}

/** Runs `f` with process.env as `env` alone (the berth command reads the process's environment). */
function withEnvironment<T>(env: Readonly<Record<string, string>>, f: () => T): T {
  const saved = { ...process.env };
  for (const name of Object.keys(process.env)) if (name.startsWith("BERTH_")) delete process.env[name];
  Object.assign(process.env, env);
  try {
    return f();
  } finally {
    for (const name of Object.keys(process.env)) if (!(name in saved)) delete process.env[name];
    Object.assign(process.env, saved);
  }
}

/** Checks a client's resolutions, in case order, against the cases: one assertion message per row. */
export function expectResolutions(cases: readonly DiscoveryCase[], resolutions: readonly Resolution[]): void {
  expect(resolutions.length, "one answer per case").toEqual(cases.length);
  cases.forEach((c, i) => {
    const got = resolutions[i]!;
    if ("error" in c.expected) {
      expect("error" in got ? got.error : JSON.stringify(got), c.name).toMatch(c.expected.error);
    } else {
      expect(got, c.name).toEqual(c.expected);
    }
  });
}
