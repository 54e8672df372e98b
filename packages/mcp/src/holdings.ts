/**
 * What this MCP server holds for its agent: locks, each on its own Hold stream, and admissions,
 * each on its own Admit stream. Streams, not leases: when this process goes away (the agent's
 * session ended, the host killed it, it crashed), its connections close and the services free
 * everything it held at once, with no ttl to wait out.
 */
import type { Admission, HeldLock } from "@berth/client";

/** An admission held until released here. */
export interface HeldAdmission {
  readonly admission: Admission;
  /** Releases it; resolves once the service confirmed (or the stream ended). */
  release(): Promise<void>;
}

/** The locks and admissions this server holds. */
export class Holdings {
  /** By canonical file. */
  readonly #locks = new Map<string, HeldLock>();
  /** By reservation id. */
  readonly #admissions = new Map<string, HeldAdmission>();
  /** Acquisitions under way, by canonical file: a second one for the file joins the first rather than queueing behind it. */
  readonly #acquiring = new Map<string, Promise<HeldLock>>();

  /** The lock held here on `file` (canonical), if it is still held. */
  lock(file: string): HeldLock | undefined {
    const held = this.#locks.get(file);
    return held === undefined || held.signal.aborted ? undefined : held;
  }

  /** Every lock held here. */
  locks(): HeldLock[] {
    return [...this.#locks.values()].filter((held) => !held.signal.aborted);
  }

  /** Keeps `held` until it is released or lost. */
  addLock(held: HeldLock): void {
    this.#locks.set(held.file, held);
    held.signal.addEventListener(
      "abort",
      () => {
        if (this.#locks.get(held.file) === held) this.#locks.delete(held.file);
      },
      { once: true },
    );
  }

  /**
   * The lock on `file` (canonical) from `acquire`, kept until released or lost; while one is under
   * way for the file, the same one (`joined`): this server must not wait in line behind itself.
   */
  async acquireLock(file: string, acquire: () => Promise<HeldLock>): Promise<{ held: HeldLock; joined: boolean }> {
    const underWay = this.#acquiring.get(file);
    if (underWay !== undefined) return { held: await underWay, joined: true };
    const acquiring = acquire();
    this.#acquiring.set(file, acquiring);
    try {
      const held = await acquiring;
      this.addLock(held);
      return { held, joined: false };
    } finally {
      this.#acquiring.delete(file);
    }
  }

  /** The admission held here under `reservationId`, if it is still held. */
  admission(reservationId: string): HeldAdmission | undefined {
    const held = this.#admissions.get(reservationId);
    return held === undefined || held.admission.signal.aborted ? undefined : held;
  }

  /** Every admission held here. */
  admissions(): HeldAdmission[] {
    return [...this.#admissions.values()].filter((held) => !held.admission.signal.aborted);
  }

  /** Keeps `held` until it is released or lost. */
  addAdmission(held: HeldAdmission): void {
    const id = held.admission.reservation.id;
    this.#admissions.set(id, held);
    held.admission.signal.addEventListener(
      "abort",
      () => {
        if (this.#admissions.get(id) === held) this.#admissions.delete(id);
      },
      { once: true },
    );
  }

  /** Releases everything held here (the agent's session ended). */
  async releaseAll(): Promise<void> {
    await Promise.allSettled([...this.locks().map((held) => held.release()), ...this.admissions().map((held) => held.release())]);
  }
}
