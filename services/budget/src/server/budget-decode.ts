/**
 * From `berth.budget.v1` requests to the budget's domain values. Every field is checked here before
 * the domain sees it, and a wrong one is refused with INVALID_ARGUMENT naming it by its proto path
 * (`need.items[2].spec.memory`, `max_wait`, `started.pid`): the domain then only ever receives plain
 * numbers it accepts.
 */
import type { Duration } from "@bufbuild/protobuf/wkt";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import type {
  BuildSpec as BuildSpecMessage,
  Cost as CostMessage,
  Need as NeedMessage,
  ResourceSpec as ResourceSpecMessage,
  Resources as ResourcesMessage,
} from "@berth/api/berth/budget/v1/budget_pb";
import { durationInputMs } from "@berth/shared/server/index";
import { invalidArgument } from "@berth/shared/errors";
import { formatDuration, LONGEST_TIMER_MS, parseCpu, parseMemory } from "@berth/shared/units";
import type { NeedItemInput, NeedKind, Resources } from "../index.js";

/** The longest duration a request may give: 24 days, what Node's timers can wait rounded down. */
export const MAX_DURATION_MS = LONGEST_TIMER_MS;
/** The longest id accepted (reservation and running entry ids are UUIDs). */
export const MAX_ID_LENGTH = 128;
/** The longest owner or name accepted, in characters (GetLimits' `max_owner_length`). */
export const MAX_OWNER_LENGTH = 256;
/** How many ids one KeepAlive may renew. */
export const MAX_KEEPALIVE_IDS = 10_000;

/** An owner or name: 1 to 256 characters, not only blanks, no control characters. */
export function checkName(value: string, field: string): string {
  if (value.trim() === "" || value.length > MAX_OWNER_LENGTH) throw invalidArgument(field, `must be 1 to ${MAX_OWNER_LENGTH} characters, not only blanks`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(value)) throw invalidArgument(field, "must not contain control characters");
  return value;
}

/** A reservation or running entry id: non-empty, at most 128 printable ASCII characters. */
export function checkId(value: string, field: string): string {
  if (value === "") throw invalidArgument(field, "is required");
  if (value.length > MAX_ID_LENGTH || !/^[\x21-\x7e]+$/.test(value)) {
    throw invalidArgument(field, `must be an id as the service returned it (at most ${MAX_ID_LENGTH} printable characters)`);
  }
  return value;
}

/** The lease ttls a request may give: the default for unset (or zero, see {@link leaseTtlMs}), the most it may ask. */
export interface LeaseLimits {
  defaultTtlMs: number;
  maxTtlMs: number;
}

/**
 * A lease's ttl as milliseconds: zero is the default ttl, and so is unset unless `unsetIsNone`
 * (RegisterRunning: no lease); longer than the maximum is refused naming `field`.
 */
export function leaseTtlMs(duration: Duration | undefined, field: string, limits: LeaseLimits, options: { unsetIsNone?: boolean } = {}): number | undefined {
  if (duration === undefined && options.unsetIsNone) return undefined;
  const ms = durationMs(duration, field);
  if (ms === undefined || ms === 0) return limits.defaultTtlMs;
  if (ms > limits.maxTtlMs)
    throw invalidArgument(
      field,
      `must be at most ${formatDuration(limits.maxTtlMs)} (the longest lease, BERTH_BUDGET_MAX_LEASE_TTL); got ${formatDuration(ms)}`,
    );
  return ms;
}

/** A request's `max_wait` as milliseconds: unset is the policy's longest wait, zero does not queue, longer is capped to the longest wait. */
export function maxWaitMs(duration: Duration | undefined, field: string, longestMs: number): number {
  const asked = durationMs(duration, field);
  return Math.min(asked ?? longestMs, longestMs);
}

/** A Duration as milliseconds, or undefined when unset: the services' one check, capped at {@link MAX_DURATION_MS}. */
export function durationMs(duration: Duration | undefined, field: string, options: { positive?: boolean } = {}): number | undefined {
  return durationInputMs(duration, field, { maxMs: MAX_DURATION_MS, ...options });
}

function bytesOf(value: bigint, field: string): number {
  if (value < 0n || value > BigInt(Number.MAX_SAFE_INTEGER)) throw invalidArgument(field, `must be 0 to ${Number.MAX_SAFE_INTEGER} bytes; got ${value}`);
  return Number(value);
}

function cpuOf(value: number, field: string): number {
  if (!Number.isFinite(value) || value < 0) throw invalidArgument(field, `must be a finite, non-negative number of cpus; got ${value}`);
  return value;
}

/** Resources sent in bytes and cores, checked. */
export function resourcesFromProto(message: ResourcesMessage | CostMessage | undefined, field: string): Resources {
  if (message === undefined) return { memoryBytes: 0, cpu: 0 };
  return { memoryBytes: bytesOf(message.memoryBytes, `${field}.memory_bytes`), cpu: cpuOf(message.cpu, `${field}.cpu`) };
}

/** What a spec or its build part declares, its size read to bytes (the one place the service reads one); what it leaves out stays out. */
function declaredAmount(part: ResourceSpecMessage | BuildSpecMessage, field: string): Partial<Resources> {
  const declared: Partial<Resources> = {};
  const memoryBytes = parseMemory(part.memory, `${field}.memory`);
  const cpu = parseCpu(part.cpu, `${field}.cpu`);
  if (memoryBytes !== undefined) declared.memoryBytes = memoryBytes;
  if (cpu !== undefined) declared.cpu = cpu;
  return declared;
}

/** What a spec declares running and building, checked field by field (a wrong build part is refused first). */
export function resourceSpecFromProto(
  spec: ResourceSpecMessage | undefined,
  field = "spec",
): { run: Partial<Resources> | undefined; build: Partial<Resources> | undefined } {
  if (spec === undefined) return { run: undefined, build: undefined };
  const build = spec.build === undefined ? undefined : declaredAmount(spec.build, `${field}.build`);
  return { run: declaredAmount(spec, field), build };
}

function needKind(kind: NeedItemKind, field: string): NeedKind {
  switch (kind) {
    case NeedItemKind.BUILD:
      return "build";
    case NeedItemKind.START:
      return "start";
    case NeedItemKind.APPLIANCE:
      return "appliance";
    default:
      throw invalidArgument(field, `must be NEED_ITEM_KIND_BUILD, NEED_ITEM_KIND_START or NEED_ITEM_KIND_APPLIANCE; got ${kind}`);
  }
}

/**
 * A Need's items as the domain takes them: each checked (kind, name, sizes, cpu), costs in bytes and
 * cores; items without a cost keep none, for the policy's default. An unset need is empty.
 */
export function needItemsFromProto(need: NeedMessage | undefined, field = "need"): NeedItemInput[] {
  if (need === undefined) return [];
  return need.items.map((item, index) => {
    const at = `${field}.items[${index}]`;
    const kind = needKind(item.kind, `${at}.kind`);
    const input: NeedItemInput = { kind, name: checkName(item.name, `${at}.name`) };
    switch (item.costSource.case) {
      case "cost": {
        input.spec = resourcesFromProto(item.costSource.value, `${at}.cost`);
        break;
      }
      case "spec": {
        // A build is costed by its spec's build part alone; anything else by its run part, the build part checked too.
        const spec = item.costSource.value;
        if (kind !== "build") input.spec = resourceSpecFromProto(spec, `${at}.spec`).run;
        else if (spec.build !== undefined) input.spec = declaredAmount(spec.build, `${at}.spec.build`);
        else input.spec = {};
        break;
      }
      default:
        break;
    }
    if (item.skipped !== undefined) {
      if (item.skipped.length > 1024) throw invalidArgument(`${at}.skipped`, "must be at most 1024 characters");
      // An empty reason still means "skipped": the domain reads truthiness, so give it one.
      input.skipped = item.skipped === "" ? "skipped" : item.skipped;
    }
    if (item.wave !== undefined) input.wave = item.wave;
    return input;
  });
}

/**
 * A running service's cost: `cost` as sent, the run part of `spec` with `undeclared` for what it
 * leaves out, or `undeclared` when neither is set (the domain's `runCostOf`: what its reservation
 * was admitted with for it, else the policy's default); and what the caller declared of it (what a
 * repeat of its request id is compared on: a default may change, what was asked does not).
 */
export function runCostFromProto(
  source: { case: "cost"; value: ResourcesMessage } | { case: "spec"; value: ResourceSpecMessage } | { case: undefined; value?: undefined },
  undeclared: Resources,
  field = "",
): { cost: Resources; declared: Partial<Resources> } {
  const at = (name: string) => (field === "" ? name : `${field}.${name}`);
  switch (source.case) {
    case "cost": {
      const cost = resourcesFromProto(source.value, at("cost"));
      return { cost, declared: cost };
    }
    case "spec": {
      const declared = resourceSpecFromProto(source.value, at("spec")).run ?? {};
      return { cost: { memoryBytes: declared.memoryBytes ?? undeclared.memoryBytes, cpu: declared.cpu ?? undeclared.cpu }, declared };
    }
    default:
      return { cost: { ...undeclared }, declared: {} };
  }
}

/** A pid as sent: a positive int32, or undefined when unset. */
export function pidFromProto(pid: number | undefined, field: string): number | undefined {
  if (pid === undefined) return undefined;
  if (!Number.isInteger(pid) || pid <= 0) throw invalidArgument(field, `must be a positive process id; got ${pid}`);
  return pid;
}
