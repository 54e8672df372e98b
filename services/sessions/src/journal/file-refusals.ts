/**
 * The file backend's failures said as refusals: no descriptor left (TOO_MANY_OPEN_FILES, after the
 * journals of idle sessions were closed and the call tried once more), and a journal deleted under
 * a read (SESSION_DELETED).
 */
import { BerthError } from "@berth/shared/errors";
import { retryAfterRelief } from "@berth/shared/descriptors";
import { descriptorRefusal } from "@berth/shared/state-errors";
import { JournalReplacedError } from "./journal-read.js";
import type { StoredEntry } from "./journal-store.js";

/**
 * Runs `work` (which opens files), once more after closing idle journals if a descriptor was
 * refused; refused again, throws RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES saying `what` failed.
 */
export function withDescriptors<T>(what: string, sessionId: string | undefined, work: () => T): T {
  try {
    return retryAfterRelief(work);
  } catch (error) {
    throw descriptorRefusal(error, what, sessionId === undefined ? {} : { sessionId }) ?? error;
  }
}

/**
 * `entries` with the failures of a read of session `sessionId` said as refusals: no descriptor left
 * (TOO_MANY_OPEN_FILES), or the journal deleted under the read (SESSION_DELETED: what was left to
 * read is gone; a new session under the id starts at seq 1).
 */
export async function* readRefusals(sessionId: string, entries: AsyncGenerator<StoredEntry>): AsyncGenerator<StoredEntry> {
  try {
    yield* entries;
  } catch (error) {
    if (error instanceof JournalReplacedError) {
      throw new BerthError(
        "not_found",
        `session ${sessionId} was deleted while its journal was read; a new session under this id starts at seq 1`,
        { sessionId },
        { reason: "SESSION_DELETED" },
      );
    }
    throw descriptorRefusal(error, `session ${sessionId}: its journal could not be read`, { sessionId }) ?? error;
  }
}
