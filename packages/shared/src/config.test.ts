import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from "vitest";
import {
  commonServerConfig,
  defineConfig,
  describeConfig,
  formatHelp,
  integerParser,
  loadConfig,
  parseBoolean,
  parseNonEmpty,
  parsePort,
  resolveToken,
  type LogLevel,
} from "./config.js";
import { isBerthError } from "./errors.js";
import { parseSize } from "./units.js";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(path.join(tmpdir(), "berth-config-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function file(name: string, content: unknown): string {
  const target = path.join(dir, name);
  writeFileSync(target, typeof content === "string" ? content : JSON.stringify(content));
  return target;
}

/** The message of the invalid_argument error `run` throws. */
function refusal(run: () => unknown): string {
  try {
    run();
  } catch (error) {
    if (isBerthError(error) && error.code === "invalid_argument") return error.message;
    throw error;
  }
  throw new Error("expected an invalid_argument error");
}

const budget = defineConfig({
  ...commonServerConfig(),
  port: { flag: "port", env: "BERTH_PORT", default: 7302, parse: parsePort, doc: "port" },
  socket: { flag: "socket", env: "BERTH_SOCKET", parse: parseNonEmpty, doc: "unix socket" },
  memory: {
    flag: "memory",
    env: "BERTH_BUDGET_MEMORY",
    aliases: ["BACKLOT_BUDGET_MEMORY"],
    default: 8 * 1024 ** 3,
    parse: parseSize,
    doc: "memory the budget may commit",
  },
  queueLimit: { flag: "queue-limit", env: "BERTH_QUEUE_LIMIT", default: 64, parse: integerParser(1, 10_000), doc: "longest queue" },
  verbose: { flag: "verbose", boolean: true, default: false, parse: parseBoolean, doc: "say more" },
});

describe("loadConfig precedence", () => {
  it("uses defaults when nothing is given", () => {
    const { values, sources, help } = loadConfig(budget, { argv: [], env: {} });
    expect(values).toMatchObject({
      stateDir: "./.berth",
      host: "127.0.0.1",
      port: 7302,
      logLevel: "info",
      maxMessageBytes: 4 * 1024 * 1024,
      keepalive: 30_000,
    });
    expect(loadConfig(budget, { argv: ["--keepalive=5s"], env: {} }).values.keepalive).toBe(5000);
    expect(values.socket).toBeUndefined();
    expect(values.token).toBeUndefined();
    expect(sources.port).toEqual({ kind: "default" });
    expect(sources.socket).toEqual({ kind: "unset" });
    expect(help).toBe(false);
  });

  it("prefers flags over env over file over defaults, setting by setting", () => {
    const config = file("precedence.json", { port: 1000, host: "127.0.0.2", "state-dir": "/from-file", memory: "1G" });
    const {
      values,
      sources,
      file: used,
    } = loadConfig(budget, {
      argv: ["--port", "3000", "--config", config],
      env: { BERTH_PORT: "2000", BERTH_HOST: "127.0.0.3" },
    });
    expect(values.port).toBe(3000);
    expect(values.host).toBe("127.0.0.3");
    expect(values.stateDir).toBe("/from-file");
    expect(values.memory).toBe(1024 ** 3);
    expect(values.logLevel).toBe("info");
    expect(used).toBe(config);
    expect(sources).toMatchObject({
      port: { kind: "flag", name: "--port" },
      host: { kind: "env", name: "BERTH_HOST" },
      stateDir: { kind: "file", name: config },
      logLevel: { kind: "default" },
    });
  });

  it("reads the file named by BERTH_CONFIG, and --config wins over it", () => {
    const fromEnv = file("env.json", { "log-level": "debug" });
    const fromFlag = file("flag.json", { logLevel: "warn" });
    expect(loadConfig(budget, { env: { BERTH_CONFIG: fromEnv } }).values.logLevel).toBe("debug");
    expect(loadConfig(budget, { argv: [`--config=${fromFlag}`], env: { BERTH_CONFIG: fromEnv } }).values.logLevel).toBe("warn");
  });

  it("reads a default file when one is given and exists, and ignores it when missing", () => {
    const fallback = file("fallback.json", { port: 4444 });
    expect(loadConfig(budget, { env: {}, file: fallback }).values.port).toBe(4444);
    const missing = loadConfig(budget, { env: {}, file: path.join(dir, "absent.json") });
    expect(missing.values.port).toBe(7302);
    expect(missing.file).toBeUndefined();
  });

  it("honours an alias after the primary variable", () => {
    expect(loadConfig(budget, { env: { BACKLOT_BUDGET_MEMORY: "2G" } }).values.memory).toBe(2 * 1024 ** 3);
    const both = loadConfig(budget, { env: { BACKLOT_BUDGET_MEMORY: "2G", BERTH_BUDGET_MEMORY: "3G" } });
    expect(both.values.memory).toBe(3 * 1024 ** 3);
    expect(both.sources.memory).toEqual({ kind: "env", name: "BERTH_BUDGET_MEMORY" });
  });

  it("treats an empty variable as unset", () => {
    expect(loadConfig(budget, { env: { BERTH_PORT: "" } }).values.port).toBe(7302);
  });

  it("reads boolean flags, --help and file booleans", () => {
    expect(loadConfig(budget, { argv: ["--verbose"] }).values.verbose).toBe(true);
    expect(loadConfig(budget, { argv: ["--verbose=false"] }).values.verbose).toBe(false);
    expect(loadConfig(budget, { argv: ["-h"] }).help).toBe(true);
    expect(loadConfig(budget, { argv: ["--help"] }).help).toBe(true);
    expect(loadConfig(budget, { env: { BERTH_CONFIG: file("bool.json", { verbose: true }) } }).values.verbose).toBe(true);
  });

  it("returns positionals only when allowed", () => {
    expect(loadConfig(budget, { argv: ["up", "--port=1"], allowPositionals: true }).positionals).toEqual(["up"]);
    expect(refusal(() => loadConfig(budget, { argv: ["up"] }))).toMatch(/^up: unexpected argument/);
  });

  it("types values: defaults make them required", () => {
    const { values } = loadConfig(budget, { env: {} });
    expectTypeOf(values.port).toEqualTypeOf<number>();
    expectTypeOf(values.stateDir).toEqualTypeOf<string>();
    expectTypeOf(values.socket).toEqualTypeOf<string | undefined>();
    expectTypeOf(values.logLevel).toEqualTypeOf<LogLevel>();
    expectTypeOf(values.verbose).toEqualTypeOf<boolean>();
  });
});

describe("loadConfig refusals", () => {
  it("names an unknown flag", () => {
    expect(refusal(() => loadConfig(budget, { argv: ["--frob=1"] }))).toMatch(/^--frob: unknown flag; known flags: --state-dir, /);
    // A near one is suggested, as every berth command suggests its own flags.
    expect(refusal(() => loadConfig(budget, { argv: ["--prot=1"] }))).toBe("--prot: unknown flag (did you mean --port?)");
  });

  it("names a flag without its value", () => {
    expect(refusal(() => loadConfig(budget, { argv: ["--port"] }))).toBe("--port: needs a value: --port=<value>");
    expect(refusal(() => loadConfig(budget, { argv: ["--port", "--host", "x"] }))).toMatch(/^--port: needs a value/);
  });

  it("names the source of a value its parser refuses", () => {
    expect(refusal(() => loadConfig(budget, { argv: ["--port=99999"] }))).toMatch(/^--port: must be a port number/);
    expect(refusal(() => loadConfig(budget, { env: { BERTH_PORT: "x" } }))).toMatch(/^BERTH_PORT: must be a port number/);
    expect(refusal(() => loadConfig(budget, { env: { BACKLOT_BUDGET_MEMORY: "lots" } }))).toMatch(/^BACKLOT_BUDGET_MEMORY: must be a size/);
    expect(refusal(() => loadConfig(budget, { env: { BERTH_LOG_LEVEL: "loud" } }))).toMatch(/^BERTH_LOG_LEVEL: must be one of fatal, /);
    expect(refusal(() => loadConfig(budget, { argv: ["--max-message-bytes=10"] }))).toMatch(/^--max-message-bytes: must be at least 1K/);
    expect(refusal(() => loadConfig(budget, { env: { BERTH_KEEPALIVE: "100ms" } }))).toMatch(/^BERTH_KEEPALIVE: must be at least 1s/);
    expect(refusal(() => loadConfig(budget, { argv: ["--cors-origin=*"] }))).toMatch(/^--cors-origin: must name each origin/);
    expect(refusal(() => loadConfig(budget, { env: { BERTH_CORS_ORIGINS: "localhost:3000" } }))).toMatch(
      /^BERTH_CORS_ORIGINS: must be an http or https origin/,
    );
    expect(refusal(() => loadConfig(budget, { argv: ["--queue-limit=0"] }))).toMatch(/^--queue-limit: must be a whole number from 1/);
    const bad = file("bad-value.json", { port: "eighty" });
    expect(refusal(() => loadConfig(budget, { argv: [`--config=${bad}`] }))).toMatch(new RegExp(`^port \\(in ${bad}\\): must be a port`));
  });

  it("names an unknown key, a malformed or missing config file", () => {
    const unknown = file("unknown.json", { prot: 1 });
    expect(refusal(() => loadConfig(budget, { argv: [`--config=${unknown}`] }))).toMatch(/^prot: unknown setting in /);
    const broken = file("broken.json", "{ port: ");
    expect(refusal(() => loadConfig(budget, { env: { BERTH_CONFIG: broken } }))).toMatch(/^config: .* is not valid JSON/);
    const list = file("list.json", [1]);
    expect(refusal(() => loadConfig(budget, { env: { BERTH_CONFIG: list } }))).toMatch(/^config: .* must hold a JSON object/);
    const nested = file("nested.json", { host: { a: 1 } });
    expect(refusal(() => loadConfig(budget, { env: { BERTH_CONFIG: nested } }))).toMatch(/^host \(in .*\): must be a string/);
    expect(refusal(() => loadConfig(budget, { argv: [`--config=${path.join(dir, "nope.json")}`] }))).toMatch(/^config: cannot read .*ENOENT/);
  });

  it("refuses a definition with a duplicate or reserved flag", () => {
    const setting = { flag: "port", parse: String, doc: "x" };
    expect(() => defineConfig({ a: setting, b: setting })).toThrow(/--port is defined twice/);
    expect(() => defineConfig({ c: { ...setting, flag: "config" } })).toThrow(/reserved/);
    expect(() => defineConfig({ d: { ...setting, flag: "Port" } })).toThrow(/kebab-case/);
  });
});

describe("reporting", () => {
  it("describes values and sources with secrets hidden", () => {
    const loaded = loadConfig(budget, { argv: ["--token=s3cret", "--port=1"], env: {} });
    const lines = describeConfig(budget, loaded);
    expect(lines).toContain("port=1 (flag --port)");
    expect(lines).toContain("token=(hidden) (flag --token)");
    expect(lines).toContain("socket=(unset) (unset)");
    expect(lines).toContain('host="127.0.0.1" (default)');
    expect(lines.join("\n")).not.toContain("s3cret");
  });

  it("lists every flag with its variable and default in help", () => {
    const help = formatHelp(budget);
    expect(help).toContain("--state-dir=<value>");
    expect(help).toContain("env BERTH_STATE_DIR; default ./.berth");
    expect(help).toContain("env BERTH_BUDGET_MEMORY, BACKLOT_BUDGET_MEMORY");
    expect(help).toContain("--config=<file>");
    expect(help).toContain("--verbose  say more (default false)");
  });
});

describe("resolveToken", () => {
  it("reads the token from a flag value or a file", () => {
    expect(resolveToken({})).toBeUndefined();
    expect(resolveToken({ token: "abc" })).toBe("abc");
    expect(resolveToken({ tokenFile: file("token", "  xyz\n") })).toBe("xyz");
  });

  it("refuses both, an empty file and a missing file", () => {
    expect(refusal(() => resolveToken({ token: "a", tokenFile: "b" }))).toMatch(/^token: give either/);
    expect(refusal(() => resolveToken({ tokenFile: file("empty-token", "\n") }))).toMatch(/^token-file: .* is empty/);
    expect(refusal(() => resolveToken({ tokenFile: path.join(dir, "none") }))).toMatch(/^token-file: cannot read .*ENOENT/);
  });
});
