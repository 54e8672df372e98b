/**
 * The settings that put a berth service on etcd (`--store etcd --etcd-endpoints …`, the key
 * prefix, TLS and authentication), declared once for every service: `berth up` merges the
 * services' settings, so both services read the same flags and go to the same cluster. A
 * service's own etcd settings (the sessions' lock lease TTL, the budget's fleet TTL) stay with it.
 */
import { readFileSync } from "node:fs";
import { defineConfig, oneOf, parseNonEmpty, type ConfigValues } from "@berth/shared/config";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import type { EtcdClient } from "./etcd-client.js";
import type { EtcdTlsOptions } from "./connections.js";

/** Where a service keeps what it shares (`--store`). */
export const STORE_KINDS = ["file", "etcd"] as const;

/** etcd's client URLs, comma-separated: each http:// or https://. */
function etcdEndpointsParser(raw: string, field: string): string[] {
  const urls = raw
    .split(",")
    .map((url) => url.trim())
    .filter((url) => url !== "");
  if (urls.length === 0) throw invalidArgument(field, "must name at least one etcd client URL, e.g. http://127.0.0.1:2379");
  for (const url of urls) {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw invalidArgument(field, `${JSON.stringify(url)} is not a URL; give etcd's client URLs as http://HOST:PORT or https://HOST:PORT, comma-separated`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw invalidArgument(field, `${JSON.stringify(url)} must be http:// or https://`);
  }
  return urls;
}

/** The store and the cluster: the same flags for every service. */
export const ETCD_SETTINGS = defineConfig({
  store: {
    flag: "store",
    env: "BERTH_STORE",
    default: "file" as (typeof STORE_KINDS)[number],
    parse: oneOf(STORE_KINDS),
    doc: "file (the state directory, one elected instance) or etcd (a cluster several instances share: --etcd-endpoints): where the sessions service keeps journals and source locks, and whether the budget publishes its machine to the fleet view",
  },
  etcdEndpoints: {
    flag: "etcd-endpoints",
    env: "BERTH_ETCD_ENDPOINTS",
    parse: etcdEndpointsParser,
    show: (urls: string[]) => urls.join(","),
    doc: "with --store etcd: etcd's client URLs, comma-separated (http://HOST:PORT or https://HOST:PORT)",
  },
  etcdPrefix: {
    flag: "etcd-prefix",
    env: "BERTH_ETCD_PREFIX",
    default: "berth/",
    parse: parseNonEmpty,
    doc: "with --store etcd: every key berth writes is under this prefix (instances with one prefix are one service)",
  },
  etcdUser: {
    flag: "etcd-user",
    env: "BERTH_ETCD_USER",
    parse: parseNonEmpty,
    doc: "with --store etcd: etcd's user, when etcd has authentication on (with --etcd-password-file)",
  },
  etcdPasswordFile: {
    flag: "etcd-password-file",
    env: "BERTH_ETCD_PASSWORD_FILE",
    parse: parseNonEmpty,
    doc: "with --store etcd: a file holding the password of --etcd-user",
  },
  etcdCaFile: {
    flag: "etcd-ca-file",
    env: "BERTH_ETCD_CA_FILE",
    parse: parseNonEmpty,
    doc: "with --store etcd over https: the CA certificate (PEM) etcd's certificates are checked against (default: the system's)",
  },
  etcdCertFile: {
    flag: "etcd-cert-file",
    env: "BERTH_ETCD_CERT_FILE",
    parse: parseNonEmpty,
    doc: "with --store etcd over https: this instance's client certificate (PEM), for etcd's --client-cert-auth",
  },
  etcdKeyFile: {
    flag: "etcd-key-file",
    env: "BERTH_ETCD_KEY_FILE",
    parse: parseNonEmpty,
    doc: "with --store etcd over https: the key (PEM) of --etcd-cert-file",
  },
});

/** The loaded values of {@link ETCD_SETTINGS}. */
export type EtcdSettingsValues = ConfigValues<typeof ETCD_SETTINGS>;

/** A combination of settings refused at start, naming the setting and what to do. */
export function unsupportedSettings(field: string, message: string): BerthError {
  return new BerthError("invalid_argument", message, { field }, { reason: "UNSUPPORTED_SETTINGS" });
}

const ETCD_ONLY: ReadonlyArray<{ key: keyof EtcdSettingsValues; flag: string }> = [
  { key: "etcdEndpoints", flag: "--etcd-endpoints" },
  { key: "etcdUser", flag: "--etcd-user" },
  { key: "etcdPasswordFile", flag: "--etcd-password-file" },
  { key: "etcdCaFile", flag: "--etcd-ca-file" },
  { key: "etcdCertFile", flag: "--etcd-cert-file" },
  { key: "etcdKeyFile", flag: "--etcd-key-file" },
];

/** Refuses etcd settings without `--store etcd`, and `--store etcd` without endpoints or with half a pair. */
export function checkEtcdSettings(values: EtcdSettingsValues): void {
  if (values.store === "file") {
    for (const { key, flag } of ETCD_ONLY) {
      if (values[key] !== undefined)
        throw unsupportedSettings(key, `${flag} is for --store etcd, and the store is file: add --store etcd (BERTH_STORE=etcd), or drop ${flag}`);
    }
    return;
  }
  if (values.etcdEndpoints === undefined)
    throw unsupportedSettings("etcdEndpoints", "--store etcd needs --etcd-endpoints (BERTH_ETCD_ENDPOINTS): etcd's client URLs, e.g. http://127.0.0.1:2379");
  if ((values.etcdUser === undefined) !== (values.etcdPasswordFile === undefined)) {
    throw unsupportedSettings("etcdUser", "--etcd-user and --etcd-password-file go together: give both, or neither");
  }
  if ((values.etcdCertFile === undefined) !== (values.etcdKeyFile === undefined)) {
    throw unsupportedSettings("etcdCertFile", "--etcd-cert-file and --etcd-key-file go together: give both, or neither");
  }
}

function readSetting(file: string, flag: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (error) {
    throw unsupportedSettings(flag, `${flag} ${file}: cannot be read (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`);
  }
}

/**
 * The etcd client the settings describe (TLS and authentication passed through). The client's
 * code, etcd's generated messages with it, loads only now: a service on the file store never has it.
 */
export async function etcdClientOf(values: EtcdSettingsValues): Promise<EtcdClient> {
  const { createEtcdClient } = await import("./etcd-client.js");
  const tls: EtcdTlsOptions = {
    ...(values.etcdCaFile !== undefined ? { ca: readSetting(values.etcdCaFile, "--etcd-ca-file") } : {}),
    ...(values.etcdCertFile !== undefined ? { cert: readSetting(values.etcdCertFile, "--etcd-cert-file") } : {}),
    ...(values.etcdKeyFile !== undefined ? { key: readSetting(values.etcdKeyFile, "--etcd-key-file") } : {}),
  };
  return createEtcdClient({
    endpoints: values.etcdEndpoints ?? [],
    prefix: values.etcdPrefix,
    ...(Object.keys(tls).length > 0 ? { tls } : {}),
    ...(values.etcdUser !== undefined && values.etcdPasswordFile !== undefined
      ? { auth: { username: values.etcdUser, password: readSetting(values.etcdPasswordFile, "--etcd-password-file").replace(/\r?\n$/, "") } }
      : {}),
  });
}
