/**
 * The budget: the machine over the last minutes (WatchMachine) as charts and figures, and the
 * queue, the reservations and the running work (WatchBudget), each queued request with its place,
 * its ETA and why it waits. Places and ETAs are not events (every change ahead moves them): the
 * places are the queue's order, the ETAs and reasons are read again (ListQueue) at most once a
 * second while the queue changes. Of a long queue the page holds the front only (QUEUE_STEP
 * requests, more on asking), and the count of the rest: ten thousand waiting requests would cost
 * the page seconds to take in, for a list that shows ten rows at once.
 */
import { BudgetEventKind, type BudgetEvent } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { Machine, QueueEntry, Reservation, RunningEntry } from "@berth/api/berth/budget/v1/budget_pb";
import type { Berth } from "@berth/client/web";
import { useEffect, useLayoutEffect, useMemo, useState } from "preact/hooks";
import { Changes, useChanges, useNow } from "./changes.js";
import { DataTable } from "./data-table.js";
import { follow, type LinkState } from "./follow.js";
import { ago, bytes, cores, durationMs, msOf, span } from "./format.js";
import { MachineChart } from "./machine-chart.js";
import { keepView, type CaughtUp, type RevisionView } from "./revision-view.js";
import { VirtualList } from "./virtual-list.js";

/** The machine's samples kept for the charts: ten minutes at one a second. */
const KEPT_SAMPLES = 600;
const ETA_REFRESH_MS = 1000;
/** How many requests at the front of the queue get their ETA read. */
const ETA_PAGE = 200;
/** How many queued requests the page holds at first, and how many more each "show more" adds. */
export const QUEUE_STEP = 500;
const GiB = 1024 ** 3;

interface Eta {
  readonly etaMs: number;
  readonly reason: string;
  readonly readAt: number;
}

export class BudgetView implements RevisionView<BudgetEvent> {
  readonly changes = new Changes();
  readonly machineChanges = new Changes();
  /** The front of the queue, in order: its first `queueLimit` requests at most. */
  queue = new Map<string, QueueEntry>();
  /** How many requests wait in all, held or not. */
  queueSize = 0;
  /** How many requests at the front the page holds (the watch's `queueLimit`). */
  queueLimit = QUEUE_STEP;
  #describing = false;
  reservations = new Map<string, Reservation>();
  running = new Map<string, RunningEntry>();
  etas = new Map<string, Eta>();
  queueVersion = 0;
  #queueList: QueueEntry[] | undefined;
  machine: Machine | undefined;
  readonly times: number[] = [];
  readonly available: number[] = [];
  readonly cgroupAvailable: (number | null)[] = [];
  readonly cpuPressure: (number | null)[] = [];
  readonly loadPerCore: (number | null)[] = [];
  machineVersion = 0;

  replace(current: readonly BudgetEvent[], caughtUp: CaughtUp): void {
    this.queue = new Map();
    this.queueSize = 0;
    this.reservations = new Map();
    this.running = new Map();
    for (const event of current) this.#apply(event);
    // A service that describes the whole queue (one without `queue_limit`) says no size.
    this.queueSize = caughtUp.queueSize ?? this.queue.size;
    this.#describing = false;
    this.#changed();
  }

  /**
   * Whether to describe the queue's front again: more of it was asked for, or requests wait beyond
   * the held front while it ran down to half what it may hold. Once true, false until the new
   * description comes.
   */
  describeFront(more = false): boolean {
    if (more) this.queueLimit += QUEUE_STEP;
    else if (this.#describing || !(this.queueSize > this.queue.size && this.queue.size < this.queueLimit / 2)) return false;
    this.#describing = true;
    return true;
  }

  apply(event: BudgetEvent): void {
    this.#apply(event);
    this.#changed();
  }

  queueList(): readonly QueueEntry[] {
    this.#queueList ??= [...this.queue.values()];
    return this.#queueList;
  }

  sample(machine: Machine): void {
    this.machine = machine;
    const time = msOf(machine.sampleTime) ?? Date.now();
    if (this.times.length > 0 && time <= this.times[this.times.length - 1]!) return;
    this.times.push(time);
    this.available.push(Number(machine.availableBytes ?? 0n) / GiB);
    this.cgroupAvailable.push(machine.cgroup?.memoryAvailable === undefined ? null : Number(machine.cgroup.memoryAvailable) / GiB);
    this.cpuPressure.push(machine.cpuPressure?.some === undefined ? null : machine.cpuPressure.some.avg10);
    this.loadPerCore.push(machine.load1 === undefined || machine.cores === 0 ? null : (machine.load1 / machine.cores) * 100);
    if (this.times.length > KEPT_SAMPLES)
      for (const list of [this.times, this.available, this.cgroupAvailable, this.cpuPressure, this.loadPerCore]) list.shift();
    this.machineVersion++;
    this.machineChanges.changed();
  }

  readEtas(entries: readonly QueueEntry[], at: number): void {
    for (const entry of entries) this.etas.set(entry.id, { etaMs: durationMs(entry.eta), reason: entry.waitForText, readAt: at });
    for (const id of this.etas.keys()) if (!this.queue.has(id)) this.etas.delete(id);
    this.changes.changed();
  }

  #apply(event: BudgetEvent): void {
    const subject = event.subject;
    switch (subject.case) {
      case "request":
        if (event.kind === BudgetEventKind.REQUEST_QUEUED) {
          this.queueSize++;
          // Held when its place falls within the held front (one resumed may join ahead of others).
          if (subject.value.position > this.queue.size + 1 || this.queue.size >= this.queueLimit) break;
          this.#insert(subject.value);
          // Its ETA and reason when it joined, until the next read of the queue.
          this.etas.set(subject.value.id, { etaMs: durationMs(subject.value.eta), reason: subject.value.waitForText, readAt: msOf(event.time) ?? Date.now() });
        } else {
          this.queueSize = Math.max(0, this.queueSize - 1);
          this.queue.delete(subject.value.id);
          this.etas.delete(subject.value.id);
        }
        this.#queueList = undefined;
        this.queueVersion++;
        break;
      case "reservation":
        if (event.kind === BudgetEventKind.RESERVATION_RELEASED || event.kind === BudgetEventKind.RESERVATION_EXPIRED)
          this.reservations.delete(subject.value.id);
        else this.reservations.set(subject.value.id, subject.value);
        break;
      case "running":
        if (event.kind === BudgetEventKind.RUNNING_REGISTERED) this.running.set(subject.value.id, subject.value);
        else this.running.delete(subject.value.id);
        break;
    }
  }

  /** Puts a request at its place in the held front (a Map keeps insertion order: one that is not last rebuilds it). */
  #insert(entry: QueueEntry): void {
    if (entry.position >= this.queue.size + 1 || entry.position < 1) {
      this.queue.set(entry.id, entry);
      return;
    }
    const held = [...this.queue];
    held.splice(entry.position - 1, 0, [entry.id, entry]);
    this.queue = new Map(held);
  }

  #changed(): void {
    this.changes.changed();
  }
}

const QUEUE_ROW = 30;

export function BudgetPanel({ berth, onLink }: { readonly berth: Berth; readonly onLink: (state: LinkState) => void }) {
  const view = useMemo(() => new BudgetView(), []);
  // A new description of the queue's front: more of it asked for, or the held front ran down.
  const [describe, describeAgain] = useState(0);
  useChanges(view.changes);
  useChanges(view.machineChanges);
  const now = useNow();

  // Opened as the panel is first laid out, not after the first paint: the data is the slow part of a load.
  useLayoutEffect(() => {
    const stop = new AbortController();
    const queueLimit = view.queueLimit;
    void follow(
      (context) => keepView(berth.budget.watchBudget({ includeCurrent: true, queueLimit, signal: context.signal }), view, context.live),
      onLink,
      stop.signal,
    );
    return () => stop.abort();
  }, [berth, view, onLink, describe]);
  useEffect(() => {
    if (view.describeFront()) describeAgain((n) => n + 1);
  });
  useLayoutEffect(() => {
    const stop = new AbortController();
    void follow(
      async (context) => {
        for await (const event of berth.budget.watchMachine({ signal: context.signal })) {
          if (event.kind === "sample") {
            view.sample(event.machine);
            context.live();
          }
        }
      },
      () => undefined,
      stop.signal,
    );
    return () => stop.abort();
  }, [berth, view]);

  // ETAs and reasons: read again when the queue changed, at most once a second.
  useEffect(() => {
    if (view.queue.size === 0) return;
    const timer = setTimeout(() => {
      berth.budget.rpc
        .listQueue({ pageSize: ETA_PAGE })
        .then((answer) => view.readEtas(answer.queue, Date.now()))
        .catch(() => undefined);
    }, ETA_REFRESH_MS);
    return () => clearTimeout(timer);
  }, [view.queueVersion, berth, view]);

  const machine = view.machine;
  const queue = view.queueList();
  const reservations = [...view.reservations.values()];
  const running = [...view.running.values()];
  return (
    <section class="panel budget" aria-labelledby="budget-title" id="budget">
      <h2 id="budget-title">Budget</h2>
      <div class="machine">
        <dl class="figures" aria-label="The machine now">
          <div>
            <dt>Available memory</dt>
            <dd>
              {bytes(machine?.availableBytes)} of {bytes(machine?.totalBytes)}
            </dd>
          </div>
          <div>
            <dt>CPU</dt>
            <dd>
              {machine?.cpuPressure?.some === undefined ? "" : `pressure ${machine.cpuPressure.some.avg10.toFixed(1)} %, `}
              load {machine?.load1?.toFixed(2) ?? "–"} on {machine?.cores ?? "–"} cores
            </dd>
          </div>
          {machine?.cgroup !== undefined && (
            <div>
              <dt>Cgroup</dt>
              <dd>
                {machine.cgroup.path}: memory {bytes(machine.cgroup.memoryMax)} max
                {machine.cgroup.cpuQuota === undefined ? "" : `, cpu quota ${cores(machine.cgroup.cpuQuota)}`}
              </dd>
            </div>
          )}
        </dl>
        <div class="charts">
          <MachineChart
            title="Available memory (GiB)"
            unit=""
            version={view.machineVersion}
            times={view.times}
            series={[
              { label: "machine", values: view.available, color: "#2563eb" },
              { label: "cgroup", values: view.cgroupAvailable, color: "#9333ea" },
            ]}
          />
          <MachineChart
            title="CPU (%)"
            unit="%"
            max={100}
            version={view.machineVersion}
            times={view.times}
            series={[
              { label: "pressure", values: view.cpuPressure, color: "#dc2626" },
              { label: "load per core", values: view.loadPerCore, color: "#ea580c" },
            ]}
          />
        </div>
      </div>

      <h3>
        Queue <span class="count">{view.queueSize}</span>
      </h3>
      {view.queueSize === 0 ? (
        <p class="empty">Nobody waits.</p>
      ) : (
        <VirtualList
          items={queue}
          rowHeight={QUEUE_ROW}
          maxHeight={QUEUE_ROW * 10}
          label="Queue, in order"
          rowKey={(entry) => entry.id}
          render={(entry, index) => {
            const eta = view.etas.get(entry.id);
            const reason = eta?.reason || entry.waitForText;
            return (
              <div class="queue-row">
                <span class="position">#{index + 1}</span>
                <span class="owner">{entry.owner}</span>
                <span class="need">
                  {bytes(entry.need?.total?.memoryBytes)}, {cores(entry.need?.total?.cpu ?? 0)} cpu
                </span>
                <span class="eta">{eta === undefined ? "ETA –" : `ETA ${span(Math.max(0, eta.etaMs - (now - eta.readAt)))}`}</span>
                <span class="reason" title={reason}>
                  {reason}
                </span>
              </div>
            );
          }}
        />
      )}
      {view.queueSize > queue.length && (
        <p class="more">
          {view.queueSize - queue.length} more wait behind these.{" "}
          <button type="button" onClick={() => view.describeFront(true) && describeAgain((n) => n + 1)}>
            Show {Math.min(QUEUE_STEP, view.queueSize - queue.length)} more
          </button>
        </p>
      )}

      <h3>
        Reservations <span class="count">{reservations.length}</span>
      </h3>
      {reservations.length === 0 ? (
        <p class="empty">None.</p>
      ) : (
        <DataTable caption="Reservations" columns={["Owner", "Memory", "CPU", "Admitted", "Lease"]}>
          {reservations.map((reservation) => (
            <tr key={reservation.id}>
              <th scope="row">{reservation.owner}</th>
              <td>{shareText(bytes((reservation.start?.memoryBytes ?? 0n) + (reservation.build?.memoryBytes ?? 0n)), reservation)}</td>
              <td class="number">{shareText(cores((reservation.start?.cpu ?? 0) + (reservation.build?.cpu ?? 0)), reservation)}</td>
              <td>{ago(msOf(reservation.admitTime), now)}</td>
              <td>{leaseLeft(msOf(reservation.expireTime), now)}</td>
            </tr>
          ))}
        </DataTable>
      )}

      <h3>
        Running <span class="count">{running.length}</span>
      </h3>
      {running.length === 0 ? (
        <p class="empty">Nothing counted.</p>
      ) : (
        <DataTable caption="Running work" columns={["Name", "Memory", "CPU", "Process", "Started"]}>
          {running.map((entry) => (
            <tr key={entry.id}>
              <th scope="row">{entry.name}</th>
              <td>{bytes(entry.cost?.memoryBytes)}</td>
              <td class="number">{cores(entry.cost?.cpu ?? 0)}</td>
              <td class="number">{entry.pid ?? "–"}</td>
              <td>{ago(msOf(entry.startTime), now)}</td>
            </tr>
          ))}
        </DataTable>
      )}
    </section>
  );
}

/** A reservation's share; what it started is counted under Running from then on. */
function shareText(share: string, reservation: Reservation): string {
  return reservation.runningIds.length === 0 ? share : `${share} (and its running work)`;
}

function leaseLeft(expires: number | undefined, now: number): string {
  if (expires === undefined) return "while its stream is open";
  const left = expires - now;
  return left > 0 ? `${span(left)} left` : "renewing…";
}
