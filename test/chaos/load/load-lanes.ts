/**
 * Client connections for the load suite, several at once and replaced as the load runs: each lane
 * holds one client (one connection); `recycle()` gives a lane a new client and closes the old one
 * once the last call that borrowed it has ended. So the server sees connections come and go, as it
 * would with many real clients, and per-connection state that is never freed shows up as a leak.
 */

interface Held<C> {
  readonly client: C;
  users: number;
  retired: boolean;
}

/** A borrowed client: call `release()` when the call made with it has ended. */
export interface Borrowed<C> {
  readonly client: C;
  release(): void;
}

/** A fixed number of lanes, each with a client that can be swapped for a new one. */
export class Lanes<C> {
  private readonly lanes: Held<C>[];
  private next = 0;
  private nextRecycle = 0;
  /** Clients retired and not yet closed (calls still running on them). */
  private readonly draining = new Set<Held<C>>();
  /** Clients made over the lanes' life (the first ones included). */
  made = 0;

  constructor(
    count: number,
    private readonly make: () => C,
    private readonly close: (client: C) => void,
  ) {
    this.lanes = Array.from({ length: count }, () => this.fresh());
  }

  /** The client of the next lane (round robin), counted as in use until released. */
  borrow(): Borrowed<C> {
    const held = this.lanes[this.next++ % this.lanes.length]!;
    held.users++;
    let released = false;
    return {
      client: held.client,
      release: () => {
        if (released) return;
        released = true;
        held.users--;
        if (held.retired && held.users === 0) this.closeHeld(held);
      },
    };
  }

  /** Gives the next lane (round robin) a new client; the old one closes after its last call. */
  recycle(): void {
    const index = this.nextRecycle++ % this.lanes.length;
    const old = this.lanes[index]!;
    this.lanes[index] = this.fresh();
    old.retired = true;
    if (old.users === 0) this.closeHeld(old);
    else this.draining.add(old);
  }

  /** Closes every client, in use or not. */
  closeAll(): void {
    for (const held of [...this.lanes, ...this.draining]) this.closeHeld(held);
  }

  private fresh(): Held<C> {
    this.made++;
    return { client: this.make(), users: 0, retired: false };
  }

  private closeHeld(held: Held<C>): void {
    this.draining.delete(held);
    this.close(held.client);
  }
}
