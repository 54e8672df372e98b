/**
 * Whether a run asks for tests that a machine may be unable to run (they need files or system
 * packages outside the repository): `BERTH_REQUIRE_<NAME>=1`, which CI sets, turns their skip into
 * a failure, so a run meant to include them cannot pass without them.
 *
 * Imports nothing: the vitest configs load it before any workspace is resolved.
 */

/** The variable that requires the tests named `name`: `BERTH_REQUIRE_ETCD` for etcd. */
export function requiringVariable(name: string): string {
  return `BERTH_REQUIRE_${name.toUpperCase()}`;
}

/** True when the environment requires the tests named `name` (any value but empty, 0 and false). */
export function isRequired(name: string, env: NodeJS.ProcessEnv = process.env): boolean {
  const value = env[requiringVariable(name)];
  return value !== undefined && value !== "" && value !== "0" && value !== "false";
}
