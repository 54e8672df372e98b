/**
 * Leases kept alive: every lease of a client shares one LeaseKeepAlive stream, each sends a
 * keepalive a third of its TTL after the last, and each knows the latest moment etcd may expire it
 * (the send time of the last answered keepalive plus the TTL etcd answered, which is never later
 * than etcd's own deadline). When that moment passes unanswered, or etcd says the lease is gone,
 * the lease is lost: its signal aborts and whoever holds something under it must stop using it.
 * Send times and deadlines are read on the clock's monotonic reading: a step of the wall clock
 * must not keep a lease this client believes alive after etcd has expired it.
 */
import { create } from "@bufbuild/protobuf";
import { wallTimeOf, type Clock, type TimerHandle } from "@berth/shared/clock";
import { LeaseKeepAliveRequestSchema, type LeaseKeepAliveRequest } from "./gen/etcd/etcdserver/etcdserverpb/rpc_pb.js";
import type { Connections, Endpoint } from "./connections.js";
import { EtcdLeaseLostError, EtcdReason, toBerthError } from "./etcd-errors.js";
import { createRequestQueue, type RequestQueue } from "./request-queue.js";

/** A lease held by this client. */
export interface EtcdLease {
  readonly id: bigint;
  /** The TTL etcd granted: at least the one asked for (etcd raises it to its minimum). */
  readonly ttlSeconds: number;
  /** Aborted, with an {@link EtcdLeaseLostError} as reason, once the lease is lost or revoked. */
  readonly signal: AbortSignal;
  /** Resolves with the loss (never rejects). */
  readonly lost: Promise<EtcdLeaseLostError>;
  /** The latest time (wall-clock ms, as of the call) etcd may expire the lease unless a keepalive gets through first. */
  deadline(): number;
  /**
   * Stops the keepalives and revokes the lease: etcd deletes every key under it at once. If etcd
   * cannot be reached the lease still ends, by expiry within its TTL; the error says so.
   */
  revoke(): Promise<void>;
}

interface KeepaliveStream {
  readonly endpoint: Endpoint;
  readonly requests: RequestQueue<LeaseKeepAliveRequest>;
  readonly abort: AbortController;
}

/**
 * How often a kept lease sends its keepalive: a third of the TTL, as etcd's own client, so that two
 * may be lost before the lease is. etcd counts the TTL from the last one, so a holder that stops may
 * lose its lease this much sooner than a full TTL after it stopped.
 */
export function keepaliveIntervalMs(ttlMs: number): number {
  return ttlMs / 3;
}

export class LeaseKeeper {
  private stream: KeepaliveStream | undefined;
  private readonly leases = new Map<bigint, KeptLease>();
  private closed = false;

  constructor(
    private readonly connections: Connections,
    private readonly clock: Clock,
    private readonly revokeLease: (id: bigint) => Promise<void>,
  ) {}

  /** Keeps `id` alive from now; `grantSentAt` is when the grant was sent (monotonic clock: the TTL counts from then at the latest). */
  keep(id: bigint, ttlSeconds: number, grantSentAt: number): EtcdLease {
    const lease = new KeptLease(this, this.clock, id, ttlSeconds, grantSentAt);
    this.leases.set(id, lease);
    // A grant answered while the client was closing: nothing will keep it alive (it expires in etcd
    // within its TTL), and its first keepalive would be due on connections that are gone.
    if (this.closed) lease.lose("the etcd client was closed");
    return lease;
  }

  /** Sends one keepalive for `lease`, opening the stream if there is none. */
  send(lease: KeptLease): void {
    const stream = (this.stream ??= this.open());
    stream.requests.push(create(LeaseKeepAliveRequestSchema, { ID: lease.id }));
  }

  forget(lease: KeptLease): void {
    this.leases.delete(lease.id);
    if (this.leases.size === 0) this.closeStream();
  }

  revoke(lease: KeptLease): Promise<void> {
    return this.revokeLease(lease.id);
  }

  close(): void {
    this.closed = true;
    for (const lease of [...this.leases.values()]) lease.lose("the etcd client was closed");
    this.closeStream();
  }

  private open(): KeepaliveStream {
    const endpoint = this.connections.current();
    const stream: KeepaliveStream = { endpoint, requests: createRequestQueue(), abort: new AbortController() };
    void this.read(stream);
    return stream;
  }

  private async read(stream: KeepaliveStream): Promise<void> {
    try {
      const headers = await this.connections.headers(stream.endpoint);
      for await (const response of stream.endpoint.lease.leaseKeepAlive(stream.requests, { signal: stream.abort.signal, headers })) {
        this.leases.get(response.ID)?.answered(response.TTL);
      }
    } catch (error) {
      if (!stream.abort.signal.aborted) {
        const mapped = toBerthError(error, { op: "lease keepalive", endpoint: stream.endpoint.url, write: false });
        if (mapped.reason === EtcdReason.UNAVAILABLE) this.connections.failed(stream.endpoint);
        else if (mapped.reason === EtcdReason.AUTH) this.connections.dropToken();
      }
    } finally {
      // The next keepalive opens a new stream (on the next member if this one failed). Keepalives
      // sent on this one are not answered now: their leases' deadlines stand as they were.
      if (this.stream === stream) this.stream = undefined;
      for (const lease of this.leases.values()) lease.streamEnded();
      stream.requests.end();
    }
  }

  private closeStream(): void {
    const stream = this.stream;
    this.stream = undefined;
    if (stream) {
      stream.requests.end();
      stream.abort.abort();
    }
  }
}

class KeptLease implements EtcdLease {
  readonly signal: AbortSignal;
  readonly lost: Promise<EtcdLeaseLostError>;
  private readonly controller = new AbortController();
  private resolveLost!: (loss: EtcdLeaseLostError) => void;
  /** Send times (monotonic clock) of the keepalives not answered yet, oldest first (etcd answers in order). */
  private unanswered: number[] = [];
  /** Monotonic clock. */
  private deadlineAt: number;
  private tickTimer: TimerHandle | undefined;
  private deadlineTimer: TimerHandle | undefined;
  private ended = false;

  constructor(
    private readonly keeper: LeaseKeeper,
    private readonly clock: Clock,
    readonly id: bigint,
    readonly ttlSeconds: number,
    grantSentAt: number,
  ) {
    this.signal = this.controller.signal;
    this.lost = new Promise((resolve) => (this.resolveLost = resolve));
    this.deadlineAt = grantSentAt + ttlSeconds * 1000;
    this.armDeadline();
    this.scheduleTick();
  }

  deadline(): number {
    return wallTimeOf(this.clock, this.deadlineAt);
  }

  async revoke(): Promise<void> {
    if (this.ended) return;
    this.lose("revoked by its holder");
    await this.keeper.revoke(this);
  }

  answered(ttl: bigint): void {
    if (this.ended) return;
    const sentAt = this.unanswered.shift() ?? this.clock.monotonicNow();
    if (ttl <= 0n) {
      this.lose("etcd says it has expired");
      return;
    }
    this.deadlineAt = Math.max(this.deadlineAt, sentAt + Number(ttl) * 1000);
    this.armDeadline();
  }

  streamEnded(): void {
    this.unanswered = [];
  }

  lose(why: string): void {
    if (this.ended) return;
    this.ended = true;
    if (this.tickTimer) this.clock.clearTimeout(this.tickTimer);
    if (this.deadlineTimer) this.clock.clearTimeout(this.deadlineTimer);
    this.keeper.forget(this);
    const loss = new EtcdLeaseLostError(this.id, why);
    this.controller.abort(loss);
    this.resolveLost(loss);
  }

  private scheduleTick(): void {
    this.tickTimer = this.clock.setTimeout(
      () => {
        if (this.ended) return;
        this.unanswered.push(this.clock.monotonicNow());
        this.keeper.send(this);
        this.scheduleTick();
      },
      keepaliveIntervalMs(this.ttlSeconds * 1000),
    );
  }

  private armDeadline(): void {
    if (this.deadlineTimer) this.clock.clearTimeout(this.deadlineTimer);
    this.deadlineTimer = this.clock.setTimeout(
      () => this.lose(`no keepalive was answered within its TTL of ${this.ttlSeconds} s`),
      this.deadlineAt - this.clock.monotonicNow(),
    );
  }
}
