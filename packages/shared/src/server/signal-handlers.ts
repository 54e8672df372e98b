/**
 * SIGTERM/SIGINT handling for a process running berth servers: the first signal shuts every
 * server down gracefully and exits 0 (1 if shutdown failed); a second signal exits at once.
 */
import type { Logger } from "../logger.js";
import type { RunningServer } from "./start-server.js";

/** Options of `installSignalHandlers`. */
export interface SignalHandlerOptions {
  /** Called with the exit code; default `process.exit`. Tests pass a spy. */
  readonly exit?: (code: number) => void;
  /** Default `["SIGTERM", "SIGINT"]`. */
  readonly signals?: readonly NodeJS.Signals[];
}

/** Exit code after a second signal cut the graceful shutdown short (128 + SIGINT, as shells do). */
export const FORCED_EXIT_CODE = 130;

/** Installs the handlers; returns a function that removes them. */
export function installSignalHandlers(servers: RunningServer | readonly RunningServer[], logger: Logger, options: SignalHandlerOptions = {}): () => void {
  const list: readonly RunningServer[] = Array.isArray(servers) ? servers : [servers as RunningServer];
  const exit = options.exit ?? ((code: number) => process.exit(code));
  const signals = options.signals ?? ["SIGTERM", "SIGINT"];
  let shuttingDown = false;

  const onSignal = (signal: NodeJS.Signals) => {
    if (shuttingDown) {
      logger.warn({ signal }, "second signal: exiting without waiting for the shutdown to finish");
      exit(FORCED_EXIT_CODE);
      return;
    }
    shuttingDown = true;
    logger.info({ signal, servers: list.map((s) => s.name) }, "signal received: shutting down (send it again to exit at once)");
    Promise.all(list.map((server) => server.close(true))).then(
      () => exit(0),
      (error: unknown) => {
        logger.error({ err: error }, "shutdown failed");
        exit(1);
      },
    );
  };

  for (const signal of signals) process.on(signal, onSignal);
  return () => {
    for (const signal of signals) process.off(signal, onSignal);
  };
}
