import { afterAll, afterEach, describe, expect, it } from "vitest";
import { G, need, testBudgets } from "./budget-fixtures.js";

const { setup, closeAll, removeAll } = testBudgets();
afterEach(closeAll);
afterAll(removeAll);

describe("budget", () => {
  describe("the wall clock steps (NTP, a person setting the date)", () => {
    const HOUR = 3_600_000;

    it("a reservation's lease runs for its ttl either way, shown as wall time when asked", async () => {
      for (const step of [-HOUR, HOUR]) {
        const { budget, clock } = await setup();
        const leased = await budget.reserve(need(6, 1), "unary client", { ttlMs: 10_000 });
        clock.advance(1000);
        clock.stepWall(step);
        expect(budget.getReservation(leased.id)!.leaseExpiresAt).toBe(clock.now() + 9000);
        clock.advance(8999);
        expect(budget.getReservation(leased.id)).toBeDefined();
        clock.advance(1);
        expect(budget.getReservation(leased.id)).toBeUndefined();
      }
    });

    it("the moving hold time counts the time really held", async () => {
      const { budget, clock } = await setup();
      const r = await budget.admit(need(1, 1), "held 10 s");
      clock.advance(5000);
      clock.stepWall(-HOUR);
      clock.advance(5000);
      budget.release(r.id);
      // The seed's rule: 0.7 x the old estimate (60 s) + 0.3 x this hold (10 s).
      expect(budget.state().holdMs).toBe(45_000);
    });

    it("memory admitted after a sample counts as unseen by it even when the wall clock stepped back", async () => {
      const { budget, clock } = await setup({ policy: { memoryBytes: 32 * G, cpu: 8 }, sample: { availableBytes: 5 * G } });
      clock.stepWall(-HOUR);
      await budget.admit(need(3, 1), "a");
      await budget.registerRunning("daemon", { memoryBytes: G, cpu: 0 });
      // 5G available less 4G admitted since the sample leaves 1G, all of it the reserve.
      expect(budget.check(need(1, 0)).fits).toBe(false);
    });

    it("a running entry's lease runs for its ttl, and carries over a restart exactly", async () => {
      const first = await setup();
      const { running: entry } = await first.budget.registerRunning("leased", { memoryBytes: G, cpu: 0 }, { ttlMs: 60_000 });
      first.clock.advance(10_000);
      first.clock.stepWall(HOUR);
      expect(first.budget.state().running[0]!.leaseExpiresAt).toBe(first.clock.now() + 50_000);
      await first.budget.close();
      // Down for 5 s, during which the wall clock steps back by 2 h.
      first.clock.advance(5000);
      first.clock.stepWall(-2 * HOUR);
      const second = await setup({ stateDir: first.stateDir, clock: first.clock });
      expect(second.budget.state().running).toMatchObject([{ id: entry.id, leaseExpiresAt: first.clock.now() + 45_000 }]);
      first.clock.advance(44_999);
      expect(second.budget.state().running).toHaveLength(1);
      first.clock.advance(1);
      expect(second.budget.state().running).toEqual([]);
    });
  });
});
