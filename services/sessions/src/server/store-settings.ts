/**
 * The settings each store refuses, checked before anything is opened: apart from the etcd store
 * itself (open-etcd-store.ts), whose code and etcd's client load only with `--store etcd`.
 */
import { checkEtcdSettings, unsupportedSettings } from "@berth/etcd/settings";
import type { SessionsValues } from "./settings.js";

/** The settings the etcd store has no use for, and why: refused at start rather than ignored. */
const FILE_ONLY: ReadonlyArray<{ key: keyof SessionsValues; flag: string; why: string }> = [
  { key: "liveDir", flag: "--live-dir", why: "a project's live directory is served in place from its files, with the seed's processes beside it" },
  { key: "projectRoot", flag: "--project-root", why: "it names the seed's lock files, which the etcd store does not keep" },
];

/** Refuses combinations of settings the chosen store cannot serve, naming the setting and what to do. */
export function checkStoreSettings(values: SessionsValues): void {
  checkEtcdSettings(values);
  if (values.store === "file") return;
  for (const { key, flag, why } of FILE_ONLY) {
    if (values[key] !== undefined) throw unsupportedSettings(key, `${flag} cannot be served with --store etcd: ${why}; drop it, or use --store file`);
  }
}
