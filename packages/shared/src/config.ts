/**
 * Typed configuration with one precedence everywhere: command-line flags, then `BERTH_*` environment
 * variables (then their legacy aliases), then a JSON config file (`--config` / `BERTH_CONFIG`), then
 * defaults. Every value remembers where it came from, so a log line or `--help` can say why the
 * service listens where it does.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { invalidArgument } from "./errors.js";
import { closest } from "./closest.js";
import { parseOrigins } from "./origins.js";
import { formatDuration, formatSize, parseDuration, parseSize } from "./units.js";

/** One setting: where it is read from, how it is parsed, what it means. */
export interface Setting<T> {
  /** The flag without dashes (`state-dir` for `--state-dir`); also the setting's key in config files. */
  flag: string;
  /** The environment variable (`BERTH_STATE_DIR`). */
  env?: string;
  /** Older environment variables still honoured, after `env` (`BACKLOT_BUDGET_MEMORY`). */
  aliases?: readonly string[];
  /** The value when no source gives one; without it the setting is optional (undefined). */
  default?: T;
  /** A flag that takes no value (`--verbose`): it reads as "true" (or its `=value`). */
  boolean?: boolean;
  /** Never shown in {@link describeConfig} or `--help` output (tokens). */
  secret?: boolean;
  /**
   * Turns the raw text into a value, throwing (preferably `invalidArgument(field, rule)`) when it is
   * unusable. `field` names where the text came from: `--port`, `BERTH_PORT`, `port (in ./berth.json)`.
   */
  parse: (raw: string, field: string) => T;
  /** One sentence for `--help`. */
  doc: string;
  /** How `--help` writes the default (`4M` rather than 4194304); default: as given. */
  show?: (value: T) => string;
}

/** A set of settings by key (the name code uses, e.g. `stateDir`). */
// biome-ignore lint/suspicious/noExplicitAny: each setting has its own value type; the record only holds them
export type ConfigDefinition = Record<string, Setting<any>>;

/** The loaded values: a setting with a default is always present, one without may be undefined. */
export type ConfigValues<D extends ConfigDefinition> = {
  [K in keyof D]: D[K] extends Setting<infer T> ? (D[K] extends { default: unknown } ? T : T | undefined) : never;
};

/** Where a value came from. `name` is the flag, variable or file that gave it. */
export interface ConfigSource {
  kind: "flag" | "env" | "file" | "default" | "unset";
  name?: string;
}

/** What {@link loadConfig} returns. */
export interface LoadedConfig<D extends ConfigDefinition> {
  values: ConfigValues<D>;
  sources: { [K in keyof D]: ConfigSource };
  /** The config file that was read, if any. */
  file?: string;
  /** True when `--help` / `-h` was given: the caller should print {@link formatHelp} and exit. */
  help: boolean;
  /** Arguments that are not flags (only when `allowPositionals`). */
  positionals: string[];
}

/** Where {@link loadConfig} reads from. */
export interface LoadConfigOptions {
  /** Command-line arguments without node and the script (`process.argv.slice(2)`). */
  argv?: readonly string[];
  /** The environment (`process.env`). */
  env?: Readonly<Record<string, string | undefined>>;
  /** A config file to read when neither `--config` nor `BERTH_CONFIG` names one; fine if missing. */
  file?: string;
  /** Accept arguments that are not flags (returned in `positionals`) instead of refusing them. */
  allowPositionals?: boolean;
}

/** Declares a set of settings, keeping their exact types for {@link loadConfig}. */
export function defineConfig<D extends ConfigDefinition>(definition: D): D {
  const flags = new Set<string>(RESERVED_FLAGS);
  for (const [key, setting] of Object.entries(definition)) {
    if (!/^[a-z][a-z0-9-]*$/.test(setting.flag)) throw new Error(`config ${key}: flag ${JSON.stringify(setting.flag)} must be kebab-case`);
    if (flags.has(setting.flag)) throw new Error(`config ${key}: flag --${setting.flag} is defined twice or reserved`);
    flags.add(setting.flag);
  }
  return definition;
}

const CONFIG_FLAG = "config";
const CONFIG_ENV = "BERTH_CONFIG";
const RESERVED_FLAGS = [CONFIG_FLAG, "help"];

/**
 * Loads `definition` from flags, environment, config file and defaults, in that order of precedence.
 * Throws `invalidArgument` naming the flag, variable or file for an unknown flag, a flag without its
 * value, an unknown key in the config file, an unreadable config file, or a value its parser refuses.
 * An empty environment variable counts as unset.
 */
export function loadConfig<D extends ConfigDefinition>(definition: D, options: LoadConfigOptions = {}): LoadedConfig<D> {
  const env = options.env ?? process.env;
  const byFlag = new Map(Object.entries(definition).map(([key, setting]) => [setting.flag, { key, setting }]));

  const { flags, help, configPath: flagConfig, positionals } = readFlags(byFlag, options.argv ?? [], options.allowPositionals ?? false);
  const envConfig = nonEmpty(env[CONFIG_ENV]);
  const explicitFile = flagConfig ?? envConfig;
  const filePath = explicitFile ?? options.file;
  const fileValues = filePath === undefined ? undefined : readConfigFile(filePath, byFlag, definition, explicitFile !== undefined);

  const values: Record<string, unknown> = {};
  const sources: Record<string, ConfigSource> = {};
  for (const [key, setting] of Object.entries(definition)) {
    const fromFlag = flags.get(setting.flag);
    if (fromFlag !== undefined) {
      values[key] = setting.parse(fromFlag, `--${setting.flag}`);
      sources[key] = { kind: "flag", name: `--${setting.flag}` };
      continue;
    }
    const variable = [setting.env, ...(setting.aliases ?? [])].find((name) => name !== undefined && nonEmpty(env[name]) !== undefined);
    if (variable !== undefined) {
      values[key] = setting.parse(env[variable]!, variable);
      sources[key] = { kind: "env", name: variable };
      continue;
    }
    const fromFile = fileValues?.get(key);
    if (fromFile !== undefined) {
      values[key] = setting.parse(fromFile, `${setting.flag} (in ${filePath})`);
      sources[key] = { kind: "file", name: filePath! };
      continue;
    }
    values[key] = setting.default;
    sources[key] = { kind: setting.default === undefined ? "unset" : "default" };
  }
  const loaded: LoadedConfig<D> = {
    values: values as ConfigValues<D>,
    sources: sources as LoadedConfig<D>["sources"],
    help,
    positionals,
  };
  if (fileValues !== undefined) loaded.file = filePath!;
  return loaded;
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value === "" ? undefined : value;
}

function readFlags(
  byFlag: Map<string, { key: string; setting: Setting<unknown> }>,
  argv: readonly string[],
  allowPositionals: boolean,
): { flags: Map<string, string>; help: boolean; configPath: string | undefined; positionals: string[] } {
  const parseOptions: Record<string, { type: "string" | "boolean"; short?: string }> = {
    [CONFIG_FLAG]: { type: "string" },
    help: { type: "boolean", short: "h" },
  };
  for (const [flag, { setting }] of byFlag) parseOptions[flag] = { type: setting.boolean ? "boolean" : "string" };
  // Not strict: parseArgs's own errors do not name berth's rules, so unknown flags and missing values
  // are reported below, from the tokens.
  const { tokens } = parseArgs({ args: [...argv], options: parseOptions, strict: false, allowPositionals: true, tokens: true });

  const flags = new Map<string, string>();
  const positionals: string[] = [];
  let help = false;
  let configPath: string | undefined;
  for (const token of tokens) {
    if (token.kind === "positional") {
      if (!allowPositionals) throw invalidArgument(token.value, "unexpected argument: settings are given as --flag=value");
      positionals.push(token.value);
      continue;
    }
    if (token.kind !== "option") continue;
    const option = parseOptions[token.name];
    if (option === undefined) {
      const known = [...byFlag.keys(), CONFIG_FLAG, "help"].map((flag) => `--${flag}`);
      const near = closest(`--${token.name}`, known);
      throw invalidArgument(token.rawName, near === undefined ? `unknown flag; known flags: ${known.join(", ")}` : `unknown flag (did you mean ${near}?)`);
    }
    if (token.name === "help") {
      help = true;
      continue;
    }
    let value: string;
    if (option.type === "boolean") {
      value = token.value ?? "true";
    } else {
      // Without strict parsing `--port --host x` would read "--host" as the port.
      if (token.value === undefined || (!token.inlineValue && token.value.startsWith("--"))) {
        throw invalidArgument(token.rawName, `needs a value: ${token.rawName}=<value>`);
      }
      value = token.value;
    }
    if (token.name === CONFIG_FLAG) configPath = value;
    else flags.set(token.name, value);
  }
  return { flags, help, configPath, positionals };
}

/** Reads the config file into raw strings by setting key; JSON numbers and booleans become text. */
function readConfigFile(
  filePath: string,
  byFlag: Map<string, { key: string; setting: Setting<unknown> }>,
  definition: ConfigDefinition,
  required: boolean,
): Map<string, string> | undefined {
  let text: string;
  try {
    text = readFileSync(filePath, "utf8");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (!required && code === "ENOENT") return undefined;
    throw invalidArgument("config", `cannot read ${filePath}: ${code ?? (error as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw invalidArgument("config", `${filePath} is not valid JSON: ${(error as Error).message}`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw invalidArgument("config", `${filePath} must hold a JSON object of settings, e.g. {"port": 7301}`);
  }
  const raw = new Map<string, string>();
  for (const [name, value] of Object.entries(parsed)) {
    // A file may use the flag name ("state-dir") or the key ("stateDir").
    const key = byFlag.get(name)?.key ?? (Object.hasOwn(definition, name) ? name : undefined);
    if (key === undefined) {
      throw invalidArgument(name, `unknown setting in ${filePath}; known: ${[...byFlag.keys()].join(", ")}`);
    }
    if (value === null) continue;
    if (typeof value !== "string" && typeof value !== "number" && typeof value !== "boolean") {
      throw invalidArgument(`${name} (in ${filePath})`, "must be a string, number or boolean");
    }
    raw.set(key, String(value));
  }
  return raw;
}

/** One line per setting, `key=value (source)`, secrets hidden: for the start-up log. */
export function describeConfig<D extends ConfigDefinition>(definition: D, loaded: LoadedConfig<D>): string[] {
  return Object.entries(definition).map(([key, setting]) => {
    const value = (loaded.values as Record<string, unknown>)[key];
    const source = (loaded.sources as Record<string, ConfigSource>)[key]!;
    const shown = value === undefined ? "(unset)" : setting.secret ? "(hidden)" : JSON.stringify(value);
    return `${setting.flag}=${shown} (${source.name ? `${source.kind} ${source.name}` : source.kind})`;
  });
}

/** The settings part of `--help`: each flag, its variable, its default and its doc. */
export function formatHelp(definition: ConfigDefinition): string {
  const lines = [`  --${CONFIG_FLAG}=<file>  a JSON file of settings by flag name (env ${CONFIG_ENV}); flags and environment win over it`];
  for (const setting of Object.values(definition)) {
    const where = [setting.env, ...(setting.aliases ?? [])].filter((name) => name !== undefined).join(", ");
    const fallback =
      setting.default === undefined || setting.secret ? "" : `; default ${setting.show ? setting.show(setting.default) : formatDefault(setting.default)}`;
    lines.push(
      `  --${setting.flag}${setting.boolean ? "" : "=<value>"}  ${setting.doc}${where ? ` (env ${where}${fallback})` : fallback ? ` (${fallback.slice(2)})` : ""}`,
    );
  }
  lines.push("  --help, -h  show this help");
  return lines.join("\n");
}

function formatDefault(value: unknown): string {
  return typeof value === "string" ? value : JSON.stringify(value);
}

// Parsers for the common kinds of settings. Each takes the field name to put in its error.

/** Any non-empty text. */
export function parseNonEmpty(raw: string, field: string): string {
  if (raw.trim() === "") throw invalidArgument(field, "must not be empty");
  return raw;
}

/** A TCP port, 0 (any free port) to 65535. */
export function parsePort(raw: string, field: string): number {
  if (!/^\d{1,5}$/.test(raw.trim()) || Number(raw) > 65535) throw invalidArgument(field, `must be a port number from 0 to 65535, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

/** A whole number within `[min, max]`. */
export function integerParser(min: number, max = Number.MAX_SAFE_INTEGER): (raw: string, field: string) => number {
  return (raw, field) => {
    const value = Number(raw.trim());
    if (!/^-?\d+$/.test(raw.trim()) || !Number.isSafeInteger(value) || value < min || value > max) {
      throw invalidArgument(field, `must be a whole number from ${min} to ${max}, got ${JSON.stringify(raw)}`);
    }
    return value;
  };
}

/** true/false, yes/no, on/off, 1/0 (any case). */
export function parseBoolean(raw: string, field: string): boolean {
  const text = raw.trim().toLowerCase();
  if (["true", "yes", "on", "1"].includes(text)) return true;
  if (["false", "no", "off", "0"].includes(text)) return false;
  throw invalidArgument(field, `must be true or false, got ${JSON.stringify(raw)}`);
}

/** One of `choices`. */
export function oneOf<const C extends readonly string[]>(choices: C): (raw: string, field: string) => C[number] {
  return (raw, field) => {
    if (!choices.includes(raw)) throw invalidArgument(field, `must be one of ${choices.join(", ")}, got ${JSON.stringify(raw)}`);
    return raw;
  };
}

/** pino's level names. */
export const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
/** A pino level name. */
export type LogLevel = (typeof LOG_LEVELS)[number];

/** What `--log-format` takes: JSON lines, or readable ones. */
export const LOG_FORMATS = ["json", "pretty"] as const;
/** A log format. */
export type LogFormat = (typeof LOG_FORMATS)[number];

/** The default largest message a server accepts or sends: 4 MiB, gRPC's usual limit. */
const DEFAULT_MESSAGE_LIMIT = 4 * 1024 * 1024;

/**
 * The settings both services share. Each service adds its own listen settings (`--sessions-port`,
 * `--budget-port`, …: distinct names, so that `berth up` can take both in one command line):
 * `defineConfig({ ...commonServerConfig(), sessionsPort: …, … })`.
 */
export function commonServerConfig() {
  return {
    stateDir: {
      flag: "state-dir",
      env: "BERTH_STATE_DIR",
      default: "./.berth",
      parse: parseNonEmpty,
      doc: "directory of the service's state (created 0700); one live service per directory",
    },
    host: {
      flag: "host",
      env: "BERTH_HOST",
      default: "127.0.0.1",
      parse: parseNonEmpty,
      doc: "address to listen on",
    },
    token: {
      flag: "token",
      env: "BERTH_TOKEN",
      secret: true,
      parse: parseNonEmpty,
      doc: "bearer token every RPC but health must carry (prefer --token-file: flags show in ps)",
    },
    tokenFile: {
      flag: "token-file",
      env: "BERTH_TOKEN_FILE",
      parse: parseNonEmpty,
      doc: "file holding the bearer token",
    },
    logLevel: {
      flag: "log-level",
      env: "BERTH_LOG_LEVEL",
      default: "info" as LogLevel,
      parse: oneOf(LOG_LEVELS),
      doc: `log level: ${LOG_LEVELS.join(", ")}`,
    },
    logFormat: {
      flag: "log-format",
      env: "BERTH_LOG_FORMAT",
      parse: oneOf(LOG_FORMATS),
      doc: "log lines as json (pino's) or pretty (readable; pino-pretty) (unset: pretty on a terminal, json otherwise)",
    },
    corsOrigins: {
      flag: "cors-origin",
      env: "BERTH_CORS_ORIGINS",
      default: [] as readonly string[],
      parse: parseOrigins,
      doc: "web page origins allowed to call from a browser, comma-separated (http://localhost:3000); none by default",
      show: (origins: readonly string[]) => (origins.length === 0 ? "none" : origins.join(",")),
    },
    maxMessageBytes: {
      flag: "max-message-bytes",
      env: "BERTH_MAX_MESSAGE_BYTES",
      default: DEFAULT_MESSAGE_LIMIT,
      parse: (raw: string, field: string) => {
        const bytes = parseSize(raw, field);
        if (bytes < 1024) throw invalidArgument(field, "must be at least 1K");
        return bytes;
      },
      doc: "largest request or response message, e.g. 4M",
      show: formatSize,
    },
    keepalive: {
      flag: "keepalive",
      env: "BERTH_KEEPALIVE",
      default: 30_000,
      parse: (raw: string, field: string) => {
        const ms = parseDuration(raw, field);
        if (ms < 1000) throw invalidArgument(field, "must be at least 1s");
        return ms;
      },
      show: formatDuration,
      doc: "HTTP/2 ping on every connection this often (a connection that does not answer within 10s is dropped); shorten it behind a proxy that cuts idle streams",
    },
  } satisfies ConfigDefinition;
}

/**
 * The bearer token from `token` or `tokenFile` (the file's content, trimmed), or undefined when neither
 * is set. Both at once, an unreadable file or an empty token are refused.
 */
export function resolveToken(values: { token?: string | undefined; tokenFile?: string | undefined }): string | undefined {
  if (values.token !== undefined && values.tokenFile !== undefined) {
    throw invalidArgument("token", "give either --token (BERTH_TOKEN) or --token-file (BERTH_TOKEN_FILE), not both");
  }
  if (values.tokenFile === undefined) return values.token;
  let token: string;
  try {
    token = readFileSync(values.tokenFile, "utf8").trim();
  } catch (error) {
    throw invalidArgument("token-file", `cannot read ${values.tokenFile}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`);
  }
  if (token === "") throw invalidArgument("token-file", `${values.tokenFile} is empty`);
  return token;
}
