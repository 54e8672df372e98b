import { ManualClock } from "@berth/shared/clock";
import { describe, expect, it } from "vitest";
import { Connections } from "./connections.js";
import { EtcdLeaseLostError } from "./etcd-errors.js";
import { LeaseKeeper } from "./lease-keeper.js";

describe("a lease granted after its client closed", () => {
  // A grant whose answer came in while the client was closing: the caller resumes after close().
  it("is lost at once, and no keepalive is ever due on the closed connections", async () => {
    const clock = new ManualClock();
    const connections = new Connections({ endpoints: ["http://127.0.0.1:1"] });
    const keeper = new LeaseKeeper(connections, clock, async () => {});
    keeper.close();
    connections.close();

    const lease = keeper.keep(7n, 3, clock.monotonicNow());
    expect(lease.signal.aborted).toBe(true);
    expect(await lease.lost).toBeInstanceOf(EtcdLeaseLostError);
    expect(clock.pendingTimers()).toBe(0);
    // Past its keepalive and its TTL: nothing runs, nothing throws.
    expect(() => clock.advance(5_000)).not.toThrow();
  });
});
