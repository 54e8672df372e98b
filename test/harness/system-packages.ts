/**
 * What some tests need beyond npm's packages: system packages a fresh clone's machine may lack.
 * Each is a vitest tag: a test file that needs one says `// @module-tag <name>` (a suite,
 * `{ tags: ["<name>"] }`). Each test config probes, once per run, only the packages its files use
 * ({@link systemPackageTags}), skips the tags whose packages are missing, and hands what it found to the global setup
 * (system-packages-notice.ts), which says in one line per package what was skipped and what to
 * install, or fails the run when `BERTH_REQUIRE_<NAME>=1` (CI) asks for those tests.
 *
 * Imports only Node's built-ins and, by relative path, modules that do too: the vitest configs load
 * it before any workspace is resolved.
 */
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { etcdMissing } from "../../packages/etcd/src/testing/etcd-installed.js";
import { isRequired, requiringVariable } from "../../packages/shared/src/testing/required-by-environment.js";

/** The interpreter that has Debian's python3-grpcio and python3-protobuf (not a pyenv or venv one). */
export const DEBIAN_PYTHON = "/usr/bin/python3";

/** The tags of the tests that need a system package. */
export type SystemPackageName = "etcd" | "python" | "go" | "chromium";

/** A system package some tests need, by the tag those tests carry. */
interface SystemPackage {
  readonly name: SystemPackageName;
  readonly description: string;
  /** Why it cannot be used here (what to install), or undefined when it can. */
  readonly missing: (env: NodeJS.ProcessEnv) => string | undefined;
}

/** What one run found missing, and whether the environment requires it anyway. */
export interface MissingSystemPackage {
  readonly name: string;
  readonly why: string;
  readonly required: boolean;
}

declare module "vitest" {
  export interface ProvidedContext {
    missingSystemPackages: MissingSystemPackage[];
  }
}

function pythonMissing(): string | undefined {
  const probe = spawnSync(DEBIAN_PYTHON, ["-c", "import grpc, google.protobuf"], { encoding: "utf8", timeout: 30_000 });
  if (probe.error !== undefined || probe.status !== 0) {
    const detail = probe.error?.message ?? probe.stderr.trim().split("\n").pop();
    return `${DEBIAN_PYTHON} lacks grpcio/protobuf (${detail}): install them (Debian: apt-get install python3-grpcio python3-protobuf)`;
  }
  const plugin = spawnSync("grpc_python_plugin", ["--version"], { stdio: "ignore", timeout: 30_000 });
  if (plugin.error !== undefined) return "grpc_python_plugin cannot be run: install it (Debian: apt-get install protobuf-compiler-grpc)";
  return undefined;
}

const GO_PACKAGES =
  "golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev golang-google-genproto-dev protoc-gen-go protoc-gen-go-grpc";

/** The Go example builds offline from Debian's Go sources (examples/go/build.sh): the compiler alone is not enough. */
const DEBIAN_GRPC_GO_SOURCES = "/usr/share/gocode/src/google.golang.org/grpc";

function goMissing(): string | undefined {
  const probe = spawnSync("go", ["version"], { encoding: "utf8", timeout: 30_000 });
  if (probe.error !== undefined || probe.status !== 0) {
    return `go cannot be run (${probe.error?.message ?? probe.stderr.trim()}): install it and the Go sources the example builds from (Debian: apt-get install ${GO_PACKAGES})`;
  }
  if (!existsSync(DEBIAN_GRPC_GO_SOURCES)) return `${DEBIAN_GRPC_GO_SOURCES} is missing: install Debian's Go sources (apt-get install ${GO_PACKAGES})`;
  return undefined;
}

/** Debian's Chromium (`BERTH_CHROMIUM` names another build), which playwright-core drives: no browser download. */
export function chromiumExecutable(env: NodeJS.ProcessEnv = process.env): string {
  return env.BERTH_CHROMIUM ?? "/usr/bin/chromium";
}

function chromiumMissing(env: NodeJS.ProcessEnv): string | undefined {
  const executable = chromiumExecutable(env);
  const probe = spawnSync(executable, ["--version"], { encoding: "utf8", timeout: 30_000 });
  if (probe.error !== undefined || probe.status !== 0) {
    return `${executable} cannot be run (${probe.error?.message ?? probe.stderr.trim()}): install it (Debian: apt-get install --no-install-recommends chromium) or set BERTH_CHROMIUM`;
  }
  return undefined;
}

const SYSTEM_PACKAGES: readonly SystemPackage[] = [
  { name: "etcd", description: "starts real etcd members (Debian: etcd-server, etcd-client)", missing: etcdMissing },
  { name: "python", description: "runs the Python client on Debian's grpcio (python3-grpcio, protobuf-compiler-grpc)", missing: pythonMissing },
  { name: "go", description: "builds and runs the Go client from Debian's Go packages (golang-go, golang-google-grpc-dev, …)", missing: goMissing },
  { name: "chromium", description: "drives Debian's Chromium with playwright-core (web pages calling berth)", missing: chromiumMissing },
];

/** Which of the named packages this machine lacks. Probes each (Python's import takes about 150 ms): call it once per run. */
export function missingSystemPackages(names: readonly SystemPackageName[], env: NodeJS.ProcessEnv = process.env): MissingSystemPackage[] {
  return packagesNamed(names).flatMap(({ name, missing }) => {
    const why = missing(env);
    return why === undefined ? [] : [{ name, why, required: isRequired(name, env) }];
  });
}

function packagesNamed(names: readonly SystemPackageName[]): SystemPackage[] {
  return SYSTEM_PACKAGES.filter(({ name }) => names.includes(name));
}

/**
 * The test config's part for the named packages: a tag per package, skipped where it is missing and
 * not required, and what was found for the global setup's notice.
 */
export function systemPackageOptions(names: readonly SystemPackageName[], missing: readonly MissingSystemPackage[]) {
  return {
    tags: packagesNamed(names).map(({ name, description }) => ({
      name,
      description,
      skip: missing.some((found) => found.name === name && !found.required),
    })),
    provide: { missingSystemPackages: [...missing] },
  };
}

/**
 * A test config's tags for the system packages its files use, probed now: a config names only those,
 * so that a run does not wait on probes for packages none of its files need.
 */
export function systemPackageTags(names: readonly SystemPackageName[], env: NodeJS.ProcessEnv = process.env) {
  return systemPackageOptions(names, missingSystemPackages(names, env));
}

/**
 * The notice for what a run found missing: one line per skipped package, or, when a required one is
 * missing, the error that fails the run.
 */
export function missingPackagesNotice(missing: readonly MissingSystemPackage[]): { lines: string[]; failure?: string } {
  const required = missing.filter((found) => found.required);
  if (required.length > 0) {
    return { lines: [], failure: required.map((found) => `${requiringVariable(found.name)} is set but ${found.why}`).join("; ") };
  }
  return { lines: missing.map((found) => `NOTE: skipped the tests that need ${found.name} (tagged ${found.name}): ${found.why}`) };
}
