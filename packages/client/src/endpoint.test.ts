import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { EndpointError, resolveEndpoint, type ServiceName } from "./endpoint.js";

const dir = mkdtempSync(path.join(tmpdir(), "berth-endpoint-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function tokenFile(name: string, text: string): string {
  const file = path.join(dir, name);
  writeFileSync(file, text, { mode: 0o600 });
  return file;
}

/** One row of the README's table: what is set, and what the client must resolve. */
interface Row {
  readonly name: string;
  readonly service: ServiceName;
  readonly url?: string;
  readonly env: Record<string, string>;
  readonly expected: string;
  readonly source: string;
}

const ROWS: Row[] = [
  { name: "the default, sessions", service: "sessions", env: {}, expected: "http://127.0.0.1:7301", source: "default" },
  { name: "the default, budget", service: "budget", env: {}, expected: "http://127.0.0.1:7302", source: "default" },
  {
    name: "an explicit URL wins over every variable",
    service: "sessions",
    url: "http://10.0.0.5:9000/",
    env: { BERTH_SESSIONS_URL: "http://127.0.0.1:1", BERTH_SESSIONS_SOCKET: "/s", BERTH_HOST: "h", BERTH_SESSIONS_PORT: "2" },
    expected: "http://10.0.0.5:9000",
    source: "option",
  },
  {
    name: "BERTH_SESSIONS_URL wins over the socket, host and port",
    service: "sessions",
    env: { BERTH_SESSIONS_URL: "unix:/run/berth/s.sock", BERTH_SESSIONS_SOCKET: "/other", BERTH_HOST: "h", BERTH_SESSIONS_PORT: "2" },
    expected: "unix:/run/berth/s.sock",
    source: "BERTH_SESSIONS_URL",
  },
  {
    name: "BERTH_BUDGET_URL is the budget's, not the sessions'",
    service: "sessions",
    env: { BERTH_BUDGET_URL: "http://127.0.0.1:9" },
    expected: "http://127.0.0.1:7301",
    source: "default",
  },
  {
    name: "BERTH_BUDGET_SOCKET wins over the host and port",
    service: "budget",
    env: { BERTH_BUDGET_SOCKET: "/run/berth/b.sock", BERTH_HOST: "h", BERTH_BUDGET_PORT: "2" },
    expected: "unix:/run/berth/b.sock",
    source: "BERTH_BUDGET_SOCKET",
  },
  {
    name: "BERTH_HOST and BERTH_SESSIONS_PORT",
    service: "sessions",
    env: { BERTH_HOST: "192.168.1.9", BERTH_SESSIONS_PORT: "8301", BERTH_BUDGET_PORT: "8302" },
    expected: "http://192.168.1.9:8301",
    source: "BERTH_HOST and BERTH_SESSIONS_PORT",
  },
  {
    name: "BERTH_BUDGET_PORT alone: loopback",
    service: "budget",
    env: { BERTH_BUDGET_PORT: "8302" },
    expected: "http://127.0.0.1:8302",
    source: "BERTH_BUDGET_PORT",
  },
  {
    name: "BERTH_HOST alone: the default port",
    service: "budget",
    env: { BERTH_HOST: "berth.local" },
    expected: "http://berth.local:7302",
    source: "BERTH_HOST",
  },
  {
    name: "0.0.0.0 is reached on loopback",
    service: "sessions",
    env: { BERTH_HOST: "0.0.0.0", BERTH_SESSIONS_PORT: "7" },
    expected: "http://127.0.0.1:7",
    source: "BERTH_HOST and BERTH_SESSIONS_PORT",
  },
  { name: ":: is reached on loopback", service: "sessions", env: { BERTH_HOST: "::" }, expected: "http://127.0.0.1:7301", source: "BERTH_HOST" },
  {
    name: "an IPv6 host is bracketed",
    service: "sessions",
    env: { BERTH_HOST: "::1", BERTH_SESSIONS_PORT: "7" },
    expected: "http://[::1]:7",
    source: "BERTH_HOST and BERTH_SESSIONS_PORT",
  },
  {
    name: "empty variables count as unset",
    service: "sessions",
    env: { BERTH_SESSIONS_URL: "", BERTH_SESSIONS_SOCKET: " ", BERTH_HOST: "", BERTH_SESSIONS_PORT: "" },
    expected: "http://127.0.0.1:7301",
    source: "default",
  },
];

describe("resolveEndpoint: the URL, row by row of the table", () => {
  for (const row of ROWS) {
    it(row.name, () => {
      const endpoint = resolveEndpoint(row.service, { url: row.url, env: row.env });
      expect(endpoint.url).toBe(row.expected);
      expect(endpoint.urlSource).toBe(row.source);
      expect(endpoint.service).toBe(row.service);
    });
  }

  it("refuses a URL that is neither http(s):// nor unix:, naming where it came from", () => {
    expect(() => resolveEndpoint("sessions", { env: { BERTH_SESSIONS_URL: "127.0.0.1:7301" } })).toThrow(
      new EndpointError('BERTH_SESSIONS_URL must look like http://127.0.0.1:7301 or unix:/path/to/socket, got "127.0.0.1:7301"'),
    );
    expect(() => resolveEndpoint("budget", { url: "ftp://x", env: {} })).toThrow(/^the budget URL must look like http:\/\/127\.0\.0\.1:7302/);
  });

  it("reads process.env when no environment is given", () => {
    const saved = process.env.BERTH_BUDGET_URL;
    process.env.BERTH_BUDGET_URL = "http://127.0.0.1:4242";
    try {
      expect(resolveEndpoint("budget").url).toBe("http://127.0.0.1:4242");
    } finally {
      if (saved === undefined) delete process.env.BERTH_BUDGET_URL;
      else process.env.BERTH_BUDGET_URL = saved;
    }
  });
});

describe("resolveEndpoint: the token, row by row of the table", () => {
  const fromFlag = tokenFile("flag", "from-flag\n");
  const fromEnvFile = tokenFile("env", "  from-env-file  \n");

  it("an explicit token wins over both files and BERTH_TOKEN", () => {
    const endpoint = resolveEndpoint("sessions", { token: "explicit", tokenFile: fromFlag, env: { BERTH_TOKEN_FILE: fromEnvFile, BERTH_TOKEN: "env" } });
    expect([endpoint.token, endpoint.tokenSource]).toEqual(["explicit", "option"]);
  });

  it("the explicit token file wins over BERTH_TOKEN_FILE and BERTH_TOKEN", () => {
    const endpoint = resolveEndpoint("sessions", { tokenFile: fromFlag, env: { BERTH_TOKEN_FILE: fromEnvFile, BERTH_TOKEN: "env" } });
    expect([endpoint.token, endpoint.tokenSource]).toEqual(["from-flag", `token file ${fromFlag}`]);
  });

  it("BERTH_TOKEN_FILE wins over BERTH_TOKEN, its whitespace dropped", () => {
    const endpoint = resolveEndpoint("budget", { env: { BERTH_TOKEN_FILE: fromEnvFile, BERTH_TOKEN: "env" } });
    expect([endpoint.token, endpoint.tokenSource]).toEqual(["from-env-file", `token file ${fromEnvFile}`]);
  });

  it("BERTH_TOKEN when no file is named (an empty BERTH_TOKEN_FILE names none)", () => {
    expect(resolveEndpoint("budget", { env: { BERTH_TOKEN: "env", BERTH_TOKEN_FILE: "" } })).toMatchObject({ token: "env", tokenSource: "BERTH_TOKEN" });
  });

  it("no token at all", () => {
    expect(resolveEndpoint("sessions", { env: {} })).toMatchObject({ token: undefined, tokenSource: undefined });
  });

  it("refuses a token file that cannot be read, or is empty", () => {
    expect(() => resolveEndpoint("sessions", { tokenFile: path.join(dir, "missing"), env: {} })).toThrow(
      new EndpointError(`cannot read the token file ${path.join(dir, "missing")}: ENOENT`),
    );
    const empty = tokenFile("empty", " \n");
    expect(() => resolveEndpoint("sessions", { env: { BERTH_TOKEN_FILE: empty } })).toThrow(new EndpointError(`the token file ${empty} is empty`));
  });
});
