/**
 * The fleet view on etcd: each budget keeps its machine's entry at `f/<machine>` (the name
 * percent-encoded, so that no name reaches into another key) under a lease of its own, kept alive
 * by the client while the budget lives. Closing revokes the lease, so a machine that stops cleanly
 * leaves the view at once; one that dies, hangs or loses etcd leaves it when the lease expires.
 */
import { compare, op, type EtcdClient, type EtcdLease, type KeyValue } from "@berth/etcd";
import { BerthError } from "@berth/shared/errors";
import type { Logger } from "@berth/shared/logger";
import { silentLogger } from "@berth/shared/logger";
import type { FleetEntry, FleetPublisher } from "../fleet.js";

/** Every fleet key starts with this. */
export const FLEET_PREFIX = "f/";
/** The end of the fleet's range: the first key after every `f/…` (`/` + 1). */
const FLEET_END = "f0";

export const fleetKey = (machine: string): string => `${FLEET_PREFIX}${encodeURIComponent(machine)}`;

/** Options of {@link EtcdFleetPublisher}. */
export interface EtcdFleetOptions {
  client: EtcdClient;
  /** The lease's TTL: how long a machine whose budget died stays in the view (etcd raises it to its minimum). */
  ttlSeconds: number;
  logger?: Logger | undefined;
}

const decoder = new TextDecoder();

function foundKv(result: unknown): KeyValue | undefined {
  return result !== undefined && typeof result === "object" && result !== null && "get" in result
    ? (result as { get: { kvs: KeyValue[] } }).get.kvs[0]
    : undefined;
}

/** An entry as read back, or undefined for a value that is not one (written by something else). */
function entryOf(value: Uint8Array): FleetEntry | undefined {
  try {
    const parsed = JSON.parse(decoder.decode(value)) as Partial<FleetEntry>;
    if (typeof parsed.machine !== "string" || typeof parsed.publishedAt !== "number" || typeof parsed.room !== "object" || parsed.room === null)
      return undefined;
    return parsed as FleetEntry;
  } catch {
    return undefined;
  }
}

export class EtcdFleetPublisher implements FleetPublisher {
  private lease: Promise<EtcdLease> | undefined;
  private closed = false;
  private readonly logger: Logger;

  constructor(private readonly options: EtcdFleetOptions) {
    this.logger = options.logger ?? silentLogger;
  }

  /** The live lease, granted again when the last one was lost (etcd was out of reach past its TTL). */
  private async currentLease(): Promise<EtcdLease> {
    const held = this.lease === undefined ? undefined : await this.lease.catch(() => undefined);
    if (held !== undefined && !held.signal.aborted) return held;
    const granting = this.options.client.grantLease(this.options.ttlSeconds);
    this.lease = granting;
    const lease = await granting;
    if (held !== undefined) this.logger.info({ ttlSeconds: lease.ttlSeconds }, "fleet: the entry's lease was lost; a new one was granted");
    return lease;
  }

  /**
   * Writes the entry if the key is this budget's (under its lease) or free; another live budget's
   * entry under the same name is not overwritten: two budgets sharing a name would each hide the
   * other's machine.
   */
  async publish(entry: FleetEntry): Promise<void> {
    if (this.closed) return;
    const lease = await this.currentLease();
    const key = fleetKey(entry.machine);
    const value = JSON.stringify(entry);
    const client = this.options.client;
    const mine = await client.txn({ compare: [compare.lease(key, "==", lease.id)], success: [op.put(key, value, lease.id)], failure: [op.get({ key })] });
    if (mine.succeeded) return;
    let holder = foundKv(mine.results[0]);
    if (holder === undefined) {
      const free = await client.txn({ compare: [compare.absent(key)], success: [op.put(key, value, lease.id)], failure: [op.get({ key })] });
      if (free.succeeded) return;
      holder = foundKv(free.results[0]);
    }
    const other = holder === undefined ? undefined : entryOf(holder.value);
    throw new BerthError(
      "failed_precondition",
      `the machine name ${JSON.stringify(entry.machine)} is published in the fleet view by another budget` +
        `${other === undefined ? "" : ` (pid ${other.pid} on ${other.hostname})`}: give each budget its own --machine-name (BERTH_BUDGET_MACHINE_NAME)`,
      { field: "machineName", machine: entry.machine },
      { reason: "MACHINE_NAME_TAKEN" },
    );
  }

  async list(options: { after?: string | undefined; limit: number }): Promise<{ entries: FleetEntry[]; more: boolean }> {
    const from = options.after === undefined ? FLEET_PREFIX : `${fleetKey(options.after)}\0`;
    const result = await this.options.client.range({ key: from, end: FLEET_END, limit: options.limit, sort: { by: "key", order: "ascend" } });
    const entries: FleetEntry[] = [];
    for (const kv of result.kvs) {
      const entry = entryOf(kv.value);
      if (entry !== undefined) entries.push(entry);
      else this.logger.warn({ key: kv.key }, "fleet: a value under the fleet's prefix is not a machine's entry; skipped");
    }
    return { entries, more: result.more };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const lease = await this.lease?.catch(() => undefined);
    await lease?.revoke();
  }
}
