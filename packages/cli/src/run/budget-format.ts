/**
 * The budget's messages written for people: the machine sample, a verdict, the whole state as
 * tables, a queue position as one status line, the fleet as one table. Sizes as `2G`, durations as `1m 5s`, cpu with at
 * most two decimals.
 */
import type { Duration, Timestamp } from "@bufbuild/protobuf/wkt";
import { msOfDuration, msOfTimestamp } from "@berth/client/wire-time";
import type { CommittedItem, Machine, PressureAverages, Resources, Verdict, WaitReason } from "@berth/api/berth/budget/v1/budget_pb";
import { CgroupVersion, Gate, QueueMode, SampleSource } from "@berth/api/berth/budget/v1/budget_pb";
import type { FleetMachine, GetLimitsResponse, GetStateResponse, Queued } from "@berth/api/berth/budget/v1/budget_service_pb";
import { formatDuration, formatSize } from "@berth/shared/units";
import { styleFor, type Style } from "../terminal.js";

/** No styles: the default, for pipes and tests. */
const PLAIN: Style = styleFor({ isTTY: false, write: () => true });

/** Bytes as people write them (`1.5G`). */
export function size(bytes: bigint | number | undefined): string {
  return bytes === undefined ? "?" : formatSize(Number(bytes));
}

/** Cores with at most two decimals. */
export function cpus(n: number): string {
  return String(Math.round(n * 100) / 100);
}

/** A Duration for people (`1m 5s`). */
export function duration(d: Duration | undefined): string {
  return d === undefined ? "-" : formatDuration(msOfDuration(d));
}

/** Milliseconds rounded to whole seconds (above one second), for lines people glance at. */
export function roughly(ms: number): string {
  return formatDuration(ms < 1000 ? Math.max(0, Math.round(ms)) : Math.round(ms / 1000) * 1000);
}

/** How long ago a timestamp was, for people (`3s ago`). */
export function ago(t: Timestamp | undefined, now = Date.now()): string {
  return t === undefined ? "-" : `${roughly(now - msOfTimestamp(t))} ago`;
}

/** Time left until a timestamp (`in 2m`), or `-`. */
function until(t: Timestamp | undefined, now = Date.now()): string {
  return t === undefined ? "-" : `in ${roughly(msOfTimestamp(t) - now)}`;
}

/** `2G, 1.5 cpu`. */
export function resources(r: Resources | undefined): string {
  return r === undefined ? "-" : `${size(r.memoryBytes)}, ${cpus(r.cpu)} cpu`;
}

/** The gate's name as the flags and messages say it. */
export function gateName(gate: Gate): string {
  switch (gate) {
    case Gate.MEMORY_BUDGET:
      return "memory_budget";
    case Gate.CPU_BUDGET:
      return "cpu_budget";
    case Gate.FREE_MEMORY:
      return "free_memory";
    case Gate.CPU_PRESSURE:
      return "cpu_pressure";
    case Gate.LOAD:
      return "load";
    case Gate.QUEUE:
      return "queue";
    default:
      return "unknown";
  }
}

/** Lays rows out in columns; the last column is not padded; the header in bold on a colour terminal. */
export function table(header: readonly string[], rows: readonly (readonly string[])[], style: Style = PLAIN): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd();
  return [style.bold(line(header)), ...rows.map(line)].map((l) => `  ${l}`).join("\n");
}

function psi(label: string, p: PressureAverages | undefined): string | undefined {
  if (p === undefined) return undefined;
  return `${label.padEnd(11)}some avg10 ${p.avg10.toFixed(1)}%  avg60 ${p.avg60.toFixed(1)}%  avg300 ${p.avg300.toFixed(1)}%`;
}

/** The machine sample, one figure per line. */
export function formatMachine(machine: Machine | undefined, now = Date.now()): string {
  if (machine === undefined) return "no machine sample yet";
  const source = machine.source === SampleSource.CGROUP ? "cgroup" : "host";
  const lines = [
    `${"memory".padEnd(11)}${size(machine.availableBytes)} available of ${size(machine.totalBytes)} (${source})`,
    `${"load".padEnd(11)}${machine.load1 === undefined ? "?" : `${machine.load1.toFixed(2)} ${machine.load5?.toFixed(2) ?? "?"} ${machine.load15?.toFixed(2) ?? "?"}`} on ${machine.cores} cores`,
    psi("cpu psi", machine.cpuPressure?.some) ?? `${"cpu psi".padEnd(11)}not available (the load gate applies)`,
    psi("memory psi", machine.memoryPressure?.some),
    psi("io psi", machine.ioPressure?.some),
  ];
  const cg = machine.cgroup;
  if (cg !== undefined) {
    const parts = [
      cg.memoryMax === undefined ? "no memory limit" : `memory limit ${size(cg.memoryMax)}`,
      cg.memoryCurrent === undefined ? undefined : `current ${size(cg.memoryCurrent)}`,
      cg.cpuQuota === undefined ? undefined : `quota ${cpus(cg.cpuQuota)} cpu`,
      cg.cpusetCpus === undefined ? undefined : `cpuset ${cg.cpusetCpus} cpus`,
    ].filter((p) => p !== undefined);
    // Which hierarchy the figures are from: v1's files say less (no pressure of their own) and differ in name.
    const version = cg.version === CgroupVersion.V1 ? " v1" : cg.version === CgroupVersion.V2 ? " v2" : "";
    lines.push(`${`cgroup${version}`.padEnd(11)}${cg.path}: ${parts.join(", ")}`);
  }
  lines.push(`${"sampled".padEnd(11)}${ago(machine.sampleTime, now)}`);
  return lines.filter((l) => l !== undefined).join("\n");
}

/** One line per sample, for `budget watch`. */
export function formatMachineLine(machine: Machine | undefined): string {
  if (machine === undefined) return "no sample";
  const at = machine.sampleTime === undefined ? "" : new Date(msOfTimestamp(machine.sampleTime)).toISOString().slice(11, 19);
  const cpu = machine.cpuPressure?.some;
  return [
    at,
    `avail ${size(machine.availableBytes)}/${size(machine.totalBytes)}`,
    `load ${machine.load1?.toFixed(2) ?? "?"}/${machine.cores}`,
    cpu === undefined ? "cpu psi -" : `cpu psi ${cpu.avg10.toFixed(1)}%/${cpu.avg60.toFixed(1)}%`,
  ].join("  ");
}

function holders(items: readonly CommittedItem[]): string {
  return items.map((h) => `${h.what} (${size(h.memoryBytes)}, ${cpus(h.cpu)} cpu)`).join(", ");
}

function reasonLines(reasons: readonly WaitReason[]): string[] {
  const lines: string[] = [];
  for (const reason of reasons) {
    lines.push(`  ${reason.message}`);
    if (reason.holders.length > 0) lines.push(`    held by: ${holders(reason.holders)}`);
  }
  return lines;
}

/** A verdict: fits, would wait (and for what, and who holds it), or impossible. */
export function formatVerdict(verdict: Verdict | undefined): string {
  if (verdict === undefined) return "no verdict";
  const need = resources(verdict.need?.total);
  const committed = verdict.committed;
  const policy = verdict.policy;
  const budget =
    policy === undefined || committed === undefined
      ? ""
      : ` (committed ${size(committed.memoryBytes)} of ${size(policy.memoryBytes)}, ${cpus(committed.cpu)} of ${cpus(policy.cpu)} cpu)`;
  if (verdict.impossible !== undefined) return `impossible: ${need} can never be admitted: ${verdict.impossible}`;
  if (verdict.fits) return `fits: ${need} can be admitted now${budget}`;
  return [`would wait: ${need} does not fit now${budget}`, ...reasonLines(verdict.waitFor)].join("\n");
}

/** The line under a table that shows `shown` of `total` entries, or nothing when it shows them all. */
function more(shown: number, total: number): string[] {
  return total > shown ? [`  … and ${total - shown} more (--all lists them)`] : [];
}

/**
 * The whole state: budget and machine in two lines, then committed, queue, reservations and
 * running as tables, each titled with how many there are in all (a table may show only the first
 * page; titles and headers in bold when `style` is a terminal's).
 */
export function formatState(state: GetStateResponse, now = Date.now(), style: Style = PLAIN): string {
  const policy = state.policy;
  const committed = state.committed;
  const out: string[] = [];
  if (policy !== undefined && committed !== undefined) {
    const mode = policy.queueMode === QueueMode.BACKFILL ? "backfill" : "fifo";
    out.push(
      `${style.bold("budget")}   ${size(committed.memoryBytes)} of ${size(policy.memoryBytes)} memory, ${cpus(committed.cpu)} of ${cpus(policy.cpu)} cpu committed` +
        `${policy.enabled ? "" : " (budget disabled: everything fits)"}; reserve ${size(policy.reserveBytes)}, ${mode} queue of at most ${policy.maxQueue}, wait up to ${duration(policy.maxWait)}`,
    );
  }
  const m = state.machine;
  if (m !== undefined) {
    const cpu = m.cpuPressure?.some;
    out.push(
      `${style.bold("machine")}  ${size(m.availableBytes)} available of ${size(m.totalBytes)}, load ${m.load1?.toFixed(2) ?? "?"} on ${m.cores} cores` +
        `${cpu === undefined ? "" : `, cpu pressure ${cpu.avg10.toFixed(1)}%/${cpu.avg60.toFixed(1)}%`} (sampled ${ago(m.sampleTime, now)})`,
    );
  }
  out.push("");
  const items = committed?.items ?? [];
  out.push(style.bold(`committed (${Math.max(committed?.itemCount ?? 0, items.length)})`));
  if (items.length > 0) {
    out.push(
      table(
        ["WHAT", "MEMORY", "CPU", "ID"],
        items.map((i) => [i.what, size(i.memoryBytes), cpus(i.cpu), i.id]),
        style,
      ),
    );
    // The rest are reservations and running entries: the tables below list them (all of them with --all).
    const left = (committed?.itemCount ?? 0) - items.length;
    if (left > 0) out.push(`  … and ${left} smaller (reservations and running work)`);
  }
  const queueSize = Math.max(state.queueSize, state.queue.length);
  out.push(style.bold(`queue (${queueSize} waiting)`));
  if (state.queue.length > 0) {
    out.push(
      table(
        ["#", "OWNER", "NEEDS", "ETA", "WAITED", "WAITING FOR", "ETA BASIS"],
        state.queue.map((q) => [
          String(q.position),
          q.owner,
          resources(q.need?.total),
          eta(q.eta),
          ago(q.enqueueTime, now).replace(" ago", ""),
          q.waitForText,
          q.etaBasis,
        ]),
        style,
      ),
    );
    out.push(...more(state.queue.length, queueSize));
  }
  const reservationCount = Math.max(state.reservationCount, state.reservations.length);
  out.push(style.bold(`reservations (${reservationCount})`));
  if (state.reservations.length > 0) {
    out.push(
      table(
        ["OWNER", "START", "BUILD", "ADMITTED", "LEASE", "ID"],
        state.reservations.map((r) => [
          r.owner,
          resources(r.start),
          resources(r.build),
          ago(r.admitTime, now),
          r.expireTime === undefined ? "stream" : until(r.expireTime, now),
          r.id,
        ]),
        style,
      ),
    );
    out.push(...more(state.reservations.length, reservationCount));
  }
  const runningCount = Math.max(state.runningCount, state.running.length);
  out.push(style.bold(`running (${runningCount})`));
  if (state.running.length > 0) {
    out.push(
      table(
        ["NAME", "COST", "PID", "STARTED", "LEASE", "ID"],
        state.running.map((r) => [
          r.name,
          resources(r.cost),
          r.pid === undefined ? "-" : String(r.pid),
          ago(r.startTime, now),
          r.expireTime === undefined ? "-" : until(r.expireTime, now),
          r.id,
        ]),
        style,
      ),
    );
    out.push(...more(state.running.length, runningCount));
  }
  return out.join("\n");
}

/** The service's limits, one per line. */
export function formatLimits(limits: GetLimitsResponse): string {
  return [
    `${"lease".padEnd(13)}${duration(limits.defaultTtl)} unless asked, at most ${duration(limits.maxTtl)}`,
    `${"wait".padEnd(13)}at most ${duration(limits.maxWait)} in the queue (the default and the cap of --max-wait)`,
    `${"heartbeat".padEnd(13)}every ${duration(limits.heartbeatInterval)} while waiting (stretched in a long queue)`,
    `${"queue".padEnd(13)}at most ${limits.maxQueue} requests`,
    `${"owner".padEnd(13)}at most ${limits.maxOwnerLength} characters`,
    `${"request ids".padEnd(13)}remembered ${duration(limits.idempotencyWindow)} after what their call made ended`,
    `${"admit resume".padEnd(13)}a broken Admit stream with a request id keeps its place for ${duration(limits.admitResumeGrace)}`,
  ].join("\n");
}

/**
 * A queue ETA for people: the service's estimate (it has the one rule, so the waiting line and
 * `berth budget state` agree), less `sinceMs` passed since it was sent; "unknown" when the service
 * has no basis for one (its `eta_basis` says why).
 */
export function eta(d: Duration | undefined, sinceMs = 0): string {
  return d === undefined ? "unknown" : roughly(Math.max(0, msOfDuration(d) - sinceMs));
}

/**
 * One status line for a waiting request: position, ETA (the service's, counted down by the `sinceMs`
 * passed since it was sent) and what it rests on, time waited, and what it waits for.
 */
export function formatQueued(queued: Queued, waitedMs: number, sinceMs = 0): string {
  // What it waits for comes before the ETA's basis: a line cut to the terminal's width keeps it.
  const basis = queued.eta === undefined ? `no ETA: ${queued.etaBasis.replace(/^unknown: /, "")}` : `ETA ${queued.etaBasis}`;
  return `waiting: #${queued.position} in queue, ETA ~${eta(queued.eta, sinceMs)}, waited ${roughly(waitedMs)} — ${queued.waitForText} (${basis})`;
}

/** A machine can take new work now: room in memory and cpu, nobody queued, the cpu gate open. */
export function hasRoom(m: FleetMachine): boolean {
  return m.queueLength === 0 && !m.cpuBusy && Number(m.room?.memoryBytes ?? 0n) > 0 && (m.room?.cpu ?? 0) > 0;
}

/** Machines with room first, then the most memory to spare, then cpu; the name breaks ties. */
export function byRoom(machines: readonly FleetMachine[]): FleetMachine[] {
  return [...machines].sort(
    (a, b) =>
      Number(hasRoom(b)) - Number(hasRoom(a)) ||
      Number((b.room?.memoryBytes ?? 0n) - (a.room?.memoryBytes ?? 0n)) ||
      (b.room?.cpu ?? 0) - (a.room?.cpu ?? 0) ||
      a.machine.localeCompare(b.machine),
  );
}

/** The fleet: one row per live machine, the roomiest first, and which one has room now. */
export function formatFleet(machines: readonly FleetMachine[], now = Date.now(), style: Style = PLAIN): string {
  if (machines.length === 0) return "no machine in the fleet view (each budget started with --store etcd publishes its own)";
  const sorted = byRoom(machines);
  const rows = sorted.map((m) => {
    const sample = m.sample;
    const status = !m.enabled ? "budget off" : m.queueLength > 0 ? `${m.queueLength} queued` : m.cpuBusy ? "cpu busy" : hasRoom(m) ? "room" : "full";
    return [
      m.machine,
      status,
      size(m.room?.memoryBytes),
      cpus(m.room?.cpu ?? 0),
      `${size(m.committed?.memoryBytes)}/${size(m.budget?.memoryBytes)}, ${cpus(m.committed?.cpu ?? 0)}/${cpus(m.budget?.cpu ?? 0)} cpu`,
      sample === undefined ? "?" : `${size(sample.availableBytes)}/${size(sample.totalBytes)}`,
      sample?.load1 === undefined ? "?" : `${sample.load1.toFixed(2)}/${sample.cores}`,
      ago(m.publishTime, now),
    ];
  });
  const out = [table(["MACHINE", "STATUS", "ROOM MEM", "ROOM CPU", "COMMITTED", "AVAILABLE", "LOAD", "PUBLISHED"], rows, style)];
  const best = sorted[0]!;
  out.push(
    hasRoom(best)
      ? `room now: ${style.bold(best.machine)} (${size(best.room?.memoryBytes)}, ${cpus(best.room?.cpu ?? 0)} cpu free in its budget)`
      : "room now: none (every machine is full, busy or has a queue)",
  );
  return out.join("\n");
}
