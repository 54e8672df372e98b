/**
 * Amounts of memory and cpu where the budget's protos carry them as people write them (a
 * ResourceSpec's and a BuildSpec's `memory` and `cpu`): the one grammar of a size and of a cpu count.
 * The command and the MCP server read what the user typed with it, the budget service reads what
 * arrives with it, and a client that holds bytes writes them with it.
 *
 * A size is a number of bytes or a number with a unit: `1024`, `100k`, `512M`, `1.5GiB`, `2G`.
 * Binary multiples throughout (`K`, `KB` and `KiB` all mean 1024, any case): memory is sold in
 * binary units, and a decimal `GB` that quietly meant 7% less would surprise. A cpu count is a
 * non-negative decimal number of cores: `0.5`, `2`.
 */

/**
 * A size string, spelt out without flags (JSON Schema's patterns take none, and the MCP server
 * publishes this one).
 */
export const SIZE_PATTERN = /^\s*(?:\d+(?:\.\d+)?|\.\d+)\s*(?:[bB]|[kKmMgGtT](?:[iI]?[bB])?)?\s*$/;

/** A cpu count as text. */
export const CPU_PATTERN = /^\s*(?:\d+(?:\.\d+)?|\.\d+)\s*$/;

/** Bytes per unit, by the unit's first letter (`KiB`, `KB` and `K` alike); none is bytes. */
const UNIT_BYTES: Readonly<Record<string, number>> = { "": 1, b: 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3, t: 1024 ** 4 };

/**
 * The bytes a size string means, rounded to whole bytes; undefined when it is not a size. Not capped:
 * the caller says how large is too large (beyond `Number.MAX_SAFE_INTEGER` bytes cannot be counted).
 */
export function bytesOfSize(text: string): number | undefined {
  if (!SIZE_PATTERN.test(text)) return undefined;
  const [, number, unit] = /^\s*([\d.]+)\s*([a-z]?)/i.exec(text) as RegExpExecArray;
  return Math.round(Number(number) * (UNIT_BYTES[unit!.toLowerCase()] as number));
}

/**
 * `bytes` as a size string that reads back exactly: the whole number of bytes. Anything else (a
 * fraction, a negative, more than can be counted) is a RangeError.
 */
export function sizeOfBytes(bytes: number): string {
  if (!Number.isSafeInteger(bytes) || bytes < 0) throw new RangeError(`a size must be a whole number of bytes ≥ 0, got ${bytes}`);
  return String(bytes);
}

/** The cores a cpu count typed as text means; undefined when it is not a non-negative decimal number. */
export function coresOfText(text: string): number | undefined {
  return CPU_PATTERN.test(text) ? Number(text) : undefined;
}
