/**
 * A ManualClock whose readings move a little between one read and the next, as real clocks do
 * (the wall clock in whole ms, the monotonic one finer): for tests of times shown together, which
 * must keep their exact differences however the reads fall.
 */
import { ManualClock } from "../clock.js";

export class DriftingClock extends ManualClock {
  private drift = 0;

  override now(): number {
    this.drift += 0.4;
    return Math.floor(super.now() + this.drift);
  }

  override monotonicNow(): number {
    this.drift += 0.4;
    return super.monotonicNow() + this.drift;
  }
}
