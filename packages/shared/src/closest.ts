/**
 * "Did you mean": the known name nearest to a mistyped one. The `berth` command's flags and
 * subcommands and the services' settings (`berth up --sesions-port`) suggest alike.
 */

/** The name in `known` nearest to `name` (a typo, a missing letter, a prefix), if any is near. */
export function closest(name: string, known: readonly string[]): string | undefined {
  if (name === "") return undefined;
  let best: { name: string; distance: number } | undefined;
  for (const candidate of known) {
    const distance = candidate.startsWith(name) && name.length >= 3 ? 0 : editDistance(name, candidate);
    if (best === undefined || distance < best.distance) best = { name: candidate, distance };
  }
  // At most two edits, and fewer than half the name: "--jsn" → "--json", not "-x" → "-h".
  return best !== undefined && best.distance <= Math.min(2, Math.floor(name.replace(/^-+/, "").length / 2)) ? best.name : undefined;
}

/** Levenshtein distance. */
function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(previous[j]! + 1, current[j - 1]! + 1, previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    previous = current;
  }
  return previous[b.length]!;
}
