/**
 * V8's garbage collector as a long-lived daemon wants it. The defaults suit short scripts and
 * browser tabs; a berth service holding thousands of open streams has a large heap that barely
 * changes, and measured with 10,000 waiting Admit streams (a 550 MB heap, 100 heartbeats a second)
 * two defaults cost more than everything else the service did:
 *
 * - The memory reducer: once allocation slows down it runs up to three extra full collections after
 *   every regular one, to give memory back. Each marks the whole heap — about 5 s of CPU at that
 *   size — and freed under 1 % of it. Delaying its start by an hour leaves it for processes that
 *   really went idle for that long.
 * - The heap growing factor: after a full collection the next one comes once the heap has grown by
 *   ~10 %, which at that size is a minute of heartbeats. Letting it grow by half before the next
 *   full collection trades some memory for a fifth of the full collections.
 *
 * Together they took the service from 80–115 ms of CPU a second to under 40 for those 10,000
 * waiters (bench `budget --only=waiters`). Set at run time they take effect only if set before
 * V8's first full collection (the memory reducer arms its timer then): an entry point calls
 * {@link tuneHeapForDaemon} before it loads anything else.
 */
import { setFlagsFromString } from "node:v8";

/** The V8 flags applied by {@link tuneHeapForDaemon}. */
export const DAEMON_HEAP_FLAGS: readonly string[] = ["--gc-memory-reducer-start-delay-ms=3600000", "--heap-growing-percent=50"];

/** Applies {@link DAEMON_HEAP_FLAGS} to this process; call once, first thing, in a service's entry point. */
export function tuneHeapForDaemon(): void {
  for (const flag of DAEMON_HEAP_FLAGS) setFlagsFromString(flag);
}
