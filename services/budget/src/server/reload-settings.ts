/**
 * Re-reading some settings of a running process (the budget's policy on SIGHUP) from the same
 * sources the process started with: its command line, its environment and its config file.
 *
 * The command line and the config file also hold settings this reader does not know (the listen
 * settings, the other service's under `berth up`), which the shared loader would refuse as
 * unknown. So only the flags of `definition` are kept from the command line, and the config
 * file's other keys are declared as settings that are read and ignored.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import type { ConfigDefinition, ConfigValues, Setting } from "@berth/shared/config";
import { loadConfig } from "@berth/shared/config";

/** Where the settings are re-read from. */
export interface ReloadSources {
  /** The process's arguments after the script (`process.argv.slice(2)`); arguments it does not know are skipped. */
  argv: readonly string[];
  env: Readonly<Record<string, string | undefined>>;
}

const ignored: Omit<Setting<string>, "flag"> = { parse: (raw) => raw, doc: "read and ignored" };

/** The keys of a JSON config file, or [] when it cannot be read (the loader then reports why). */
function configKeys(file: string): string[] {
  try {
    const parsed = JSON.parse(readFileSync(file, "utf8")) as unknown;
    return parsed !== null && typeof parsed === "object" && !Array.isArray(parsed) ? Object.keys(parsed) : [];
  } catch {
    return [];
  }
}

/**
 * Loads `definition` from `sources` with the shared loader's precedence (flags, environment,
 * config file, defaults), ignoring flags and config keys that belong to other settings. Throws as
 * the loader does for a value that does not parse, or an unreadable config file.
 */
export function reloadSettings<D extends ConfigDefinition>(definition: D, sources: ReloadSources): ConfigValues<D> {
  const flags = new Map(Object.values(definition).map((setting) => [setting.flag, setting]));
  const options: Record<string, { type: "string" | "boolean" }> = { config: { type: "string" } };
  for (const [flag, setting] of flags) options[flag] = { type: setting.boolean ? "boolean" : "string" };

  const { tokens } = parseArgs({ args: [...sources.argv], options, strict: false, allowPositionals: true, tokens: true });
  const argv: string[] = [];
  let configFile: string | undefined;
  for (const token of tokens) {
    if (token.kind !== "option") continue;
    if (token.name === "config" && token.value !== undefined) {
      configFile = token.value;
      argv.push(`--config=${token.value}`);
      continue;
    }
    const setting = flags.get(token.name);
    if (setting === undefined) continue;
    if (setting.boolean) argv.push(token.value === undefined ? `--${token.name}` : `--${token.name}=${token.value}`);
    else if (token.value !== undefined) argv.push(`--${token.name}=${token.value}`);
  }
  configFile ??= sources.env["BERTH_CONFIG"] || undefined;

  const extended: ConfigDefinition = { ...definition };
  if (configFile !== undefined) {
    const keys = new Set(Object.keys(definition));
    configKeys(configFile).forEach((name, index) => {
      if (flags.has(name) || keys.has(name)) return;
      // A file names a setting by its flag (kebab-case) or its key (camelCase): declare whichever it used.
      if (/^[a-z][a-z0-9-]*$/.test(name)) extended[`__ignored${index}`] = { ...ignored, flag: name };
      else extended[name] = { ...ignored, flag: `ignored-config-key-${index}` };
    });
  }
  return loadConfig(extended, { argv, env: sources.env }).values as ConfigValues<D>;
}
