/**
 * The history both stores' retention tests start from: at T0 "old" completes, "revived" is
 * discarded and "active" starts; two hours later "young" completes and "revived" is active again.
 * The clock is left at T0 + 2h.
 */
import type { ManualClock } from "@berth/shared/clock";

export const HOUR = 3_600_000;

export async function appendRetentionHistory(
  writer: { append(sessionId: string, events: readonly unknown[]): Promise<unknown> },
  clock: ManualClock,
): Promise<void> {
  await writer.append("old", [{ type: "generate" }, { type: "complete" }]);
  await writer.append("revived", [{ type: "generate" }, { type: "discarded" }]);
  await writer.append("active", [{ type: "generate" }]);
  clock.advance(2 * HOUR);
  await writer.append("young", [{ type: "generate" }, { type: "complete" }]);
  await writer.append("revived", [{ type: "generate" }]);
}
