/**
 * What work costs: the resources one item declares (or the policy's default when it declares none),
 * and what a whole request needs once its items are added up the way they actually run.
 *
 * A request is a list of items: builds (grouped in waves) and starts (services, appliances). Starts
 * keep running for the whole operation, so their costs add up and are held until the reservation is
 * released. Builds of one wave run at the same time, so their costs add up too, but waves run one
 * after another: only the costliest wave is held, and only while building.
 */
import { invalidArgument } from "@berth/shared/errors";

/**
 * An amount of memory and cpu: the budget's one. What a caller declares of it is a
 * `Partial<Resources>` (what it leaves out takes the policy's default), in bytes and cores already:
 * sizes are read where they enter, in the server's decoder.
 */
export interface Resources {
  memoryBytes: number;
  cpu: number;
}

/** What one item costs, and whether it said so itself. */
export interface Cost extends Resources {
  /** False when the item did not declare both memory and cpu and a policy default filled the gap. */
  declared: boolean;
}

/** The defaults a policy supplies for items that declare nothing. */
export interface CostDefaults {
  defaultRun: Resources;
  defaultBuild: Resources;
}

/** The kinds of item a request holds. `appliance` counts like `start` (it runs for the whole operation). */
export type NeedKind = "build" | "start" | "appliance";

/** One resolved item of a request. */
export interface NeedItem {
  kind: NeedKind;
  name: string;
  cost: Cost;
  /** A build that will not run (its inputs are unchanged): listed, costs nothing. The text says why. */
  skipped?: string | undefined;
  /** Builds sharing a wave run at once and their costs add up; a build without a wave runs alone. */
  wave?: number | undefined;
}

/** One item as a caller sends it: its own resources (`spec`) or none (then the policy's default applies). */
export interface NeedItemInput {
  kind: NeedKind;
  name: string;
  /** The item's own memory and cpu: a build's build cost, a start's running cost. */
  spec?: Partial<Resources> | undefined;
  skipped?: string | undefined;
  wave?: number | undefined;
}

/** What a request needs, split by how long each part is held. */
export interface Need {
  items: NeedItem[];
  /** Run resources of everything started: held for the whole operation. */
  start: Resources;
  /** The costliest build wave: held only while building. */
  build: Resources;
}

function costOf(amount: Partial<Resources> | undefined, fallback: Resources, field: string): Cost {
  const declared = checkAmount(amount ?? {}, field);
  return {
    memoryBytes: declared.memoryBytes ?? fallback.memoryBytes,
    cpu: declared.cpu ?? fallback.cpu,
    declared: declared.memoryBytes !== undefined && declared.cpu !== undefined,
  };
}

/**
 * What a service or appliance costs running and building: what it declares of each, or the policy's
 * conservative default for whatever it leaves out. `field` prefixes the name of a wrong value in the
 * error (`spec.build.cpu: must be a non-negative number of cpus; got -1`).
 */
export function costsOf(
  run: Partial<Resources> | undefined,
  build: Partial<Resources> | undefined,
  defaults: CostDefaults,
  field = "spec",
): { run: Cost; build: Cost } {
  return {
    run: costOf(run, defaults.defaultRun, field),
    build: costOf(build, defaults.defaultBuild, `${field}.build`),
  };
}

/**
 * Resolves the items a caller sent into costed items: each item's own `spec`, or the default for its
 * kind (builds take the default build cost, starts and appliances the default run cost). A wrong
 * value is refused naming the item: `items[2].spec.cpu: must be a non-negative number of cpus; got -1`.
 */
export function resolveItems(inputs: readonly NeedItemInput[], defaults: CostDefaults, field = "items"): NeedItem[] {
  return inputs.map((input, index) => {
    const at = `${field}[${index}]`;
    if (input.kind !== "build" && input.kind !== "start" && input.kind !== "appliance") {
      throw invalidArgument(`${at}.kind`, `must be build, start or appliance; got ${JSON.stringify(input.kind)}`);
    }
    if (input.wave !== undefined && !Number.isInteger(input.wave)) {
      throw invalidArgument(`${at}.wave`, `must be a whole number; got ${JSON.stringify(input.wave)}`);
    }
    const fallback = input.kind === "build" ? defaults.defaultBuild : defaults.defaultRun;
    const item: NeedItem = { kind: input.kind, name: input.name, cost: costOf(input.spec, fallback, `${at}.spec`) };
    if (input.skipped) item.skipped = input.skipped;
    if (input.wave !== undefined) item.wave = input.wave;
    return item;
  });
}

/**
 * Adds a request's items up the way they run: starts add up (held for the whole operation); builds
 * of one wave add up and the costliest wave is what is held while building, memory and cpu each
 * taken from their own costliest wave; a build without a wave runs alone; skipped builds cost nothing.
 */
export function needOf(items: NeedItem[]): Need {
  const start: Resources = { memoryBytes: 0, cpu: 0 };
  const waves = new Map<string, Resources>();
  items.forEach((item, index) => {
    if (item.skipped) return;
    if (item.kind === "build") {
      const key = item.wave === undefined ? `solo:${index}` : `wave:${item.wave}`;
      const wave = waves.get(key) ?? { memoryBytes: 0, cpu: 0 };
      wave.memoryBytes += item.cost.memoryBytes;
      wave.cpu += item.cost.cpu;
      waves.set(key, wave);
    } else {
      start.memoryBytes += item.cost.memoryBytes;
      start.cpu += item.cost.cpu;
    }
  });
  const build: Resources = { memoryBytes: 0, cpu: 0 };
  for (const wave of waves.values()) {
    build.memoryBytes = Math.max(build.memoryBytes, wave.memoryBytes);
    build.cpu = Math.max(build.cpu, wave.cpu);
  }
  return { items, start, build };
}

/** `needOf(resolveItems(inputs, defaults))`: what the items a caller sent need. */
export function needFromItems(inputs: readonly NeedItemInput[], defaults: CostDefaults, field = "items"): Need {
  return needOf(resolveItems(inputs, defaults, field));
}

/** The whole of a need: its start part and its build part together (what admission must find room for). */
export function total(need: Pick<Need, "start" | "build">): Resources {
  return { memoryBytes: need.start.memoryBytes + need.build.memoryBytes, cpu: need.start.cpu + need.build.cpu };
}

/** True when a need asks for nothing at all (every build skipped, nothing to start): it never waits. */
export function isZero(resources: Resources): boolean {
  return resources.memoryBytes === 0 && resources.cpu === 0;
}

/** Checks resources given as numbers (memory in bytes): finite and non-negative, else invalid_argument naming `field`. */
export function checkResources(resources: Resources, field: string): Resources {
  return { memoryBytes: checkBytes(resources.memoryBytes, `${field}.memoryBytes`), cpu: checkCpu(resources.cpu, `${field}.cpu`) };
}

/** {@link checkResources} for a declared amount, whose parts may be left out. */
function checkAmount(amount: Partial<Resources>, field: string): Partial<Resources> {
  return {
    memoryBytes: amount.memoryBytes === undefined ? undefined : checkBytes(amount.memoryBytes, `${field}.memoryBytes`),
    cpu: amount.cpu === undefined ? undefined : checkCpu(amount.cpu, `${field}.cpu`),
  };
}

function checkBytes(bytes: number, field: string): number {
  if (!Number.isSafeInteger(bytes) || bytes < 0) throw invalidArgument(field, `must be a whole, non-negative number of bytes; got ${bytes}`);
  return bytes;
}

function checkCpu(cpu: number, field: string): number {
  if (!Number.isFinite(cpu) || cpu < 0) throw invalidArgument(field, `must be a non-negative number of cpus; got ${cpu}`);
  return cpu;
}
