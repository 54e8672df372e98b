/**
 * The process around one or more berth servers: read the settings (flags > BERTH_* environment >
 * config file > defaults), make the logger, start each service, shut down on SIGTERM/SIGINT.
 * `services/<name>/src/main.ts` runs one service with it and `berth up` runs both.
 */
import type { Logger } from "pino";
import { commonServerConfig, describeConfig, formatHelp, loadConfig, resolveToken, type ConfigDefinition, type ConfigValues } from "../config.js";
import { reportTimerErrorsTo } from "../clock.js";
import { descriptorLimit, descriptorShares } from "../descriptors.js";
import { fileElector } from "../election.js";
import type { Elector } from "../elector.js";
import { isBerthError } from "../errors.js";
import { DEFAULT_KEEPALIVE } from "./listener.js";
import { createServiceLogger } from "./service-logger.js";
import { installSignalHandlers } from "./signal-handlers.js";
import { startServer, type RunningServer, type StartServerOptions } from "./start-server.js";

/** The settings every service reads (state dir, host, token, log level, message limit). */
export type CommonValues = ConfigValues<ReturnType<typeof commonServerConfig>>;

/** One service as a process runs it: its own settings and how to start it from their values. */
export interface ServiceDefinition<D extends ConfigDefinition = ConfigDefinition> {
  readonly name: string;
  /** The service's own settings (merged with the common ones; names must not clash across services). */
  readonly settings: D;
  /**
   * Takes the election lock of the state directory and starts serving. Whatever it opens is
   * closed by the server's shutdown hooks; when it throws, it must leave nothing held behind.
   */
  start(values: CommonValues & ConfigValues<D>, logger: Logger): Promise<RunningServer>;
}

/**
 * Something served beside the services that calls them from a browser (`berth up --ui`'s page):
 * its settings join the services', it starts before them (so its origins are known), and the
 * origins it is served under join every service's CORS allow-list.
 */
export interface Companion<D extends ConfigDefinition = ConfigDefinition> {
  readonly settings: D;
  /** Starts it, or not (undefined) as its settings say; `servers` lists the services started so far. */
  start(values: ConfigValues<D>, servers: () => readonly RunningServer[]): Promise<StartedCompanion | undefined>;
}

/** A companion that runs. */
export interface StartedCompanion {
  /** Where a person opens it. */
  readonly url: string;
  /** The origins its pages run under: every service allows them. */
  readonly origins: readonly string[];
  close(): Promise<void>;
}

/** What `runServices` needs from its surroundings (tests pass their own). */
export interface RunOptions {
  readonly argv: readonly string[];
  readonly env?: NodeJS.ProcessEnv;
  /** Where usage errors and refusals go; default stderr. */
  readonly write?: (text: string) => void;
  /** Default `process.exit`. */
  readonly exit?: (code: number) => void;
  /** The command name shown in `--help` and in error messages. */
  readonly command: string;
  /** What `--help` prints above the list of flags; default a one-line usage. */
  readonly usage?: string;
  /** Served beside the services (the live page). */
  readonly companion?: Companion;
}

/**
 * Starts every service in `definitions` in this process, or none: if one fails to start (its state
 * directory is served by another process, its port is taken), the ones already started are closed
 * and the process exits 1 with a message naming the cause. Resolves with the running servers.
 */
export async function runServices(definitions: readonly ServiceDefinition[], options: RunOptions): Promise<RunningServer[] | undefined> {
  const write = options.write ?? ((text: string) => process.stderr.write(text));
  const exit = options.exit ?? ((code: number) => process.exit(code));
  const definition: ConfigDefinition = Object.assign({}, commonServerConfig(), options.companion?.settings, ...definitions.map((d) => d.settings));

  let loaded;
  try {
    loaded = loadConfig(definition, { argv: options.argv, env: options.env ?? process.env });
  } catch (error) {
    write(`${options.command}: ${error instanceof Error ? error.message : String(error)}\n`);
    exit(2);
    return undefined;
  }
  if (loaded.help) {
    process.stdout.write(`${options.usage ?? `usage: ${options.command} [flags]`}\n\nflags:\n${formatHelp(definition)}\n`);
    exit(0);
    return undefined;
  }

  const values = loaded.values as CommonValues & Record<string, unknown>;
  const { logger } = await createServiceLogger({ level: values.logLevel, format: values.logFormat, env: options.env ?? process.env });
  logger.info({ settings: describeConfig(definition, loaded) }, "settings");
  const shares = descriptorShares(descriptorLimit());
  logger.info(
    { descriptorLimit: shares.limit ?? null, connections: shares.limit === undefined ? null : shares.connections, spareConnections: shares.spareConnections },
    "descriptors: client connections kept open, and spare ones answered and closed over those (ulimit -n shared out)",
  );
  // A lease's or a queue's timer that throws (no descriptor left for a file, say) is logged: ending
  // the process would drop every lock, lease and queue place it keeps.
  reportTimerErrorsTo((error) => logger.error({ err: error }, "a timer's work failed; the service goes on"));

  // The handlers go in before the first server starts: a signal during start-up closes what has
  // started so far (the list is read when the signal comes) instead of killing the process outright.
  const started: RunningServer[] = [];
  const uninstall = installSignalHandlers(started, logger, { exit });
  let companion: StartedCompanion | undefined;
  try {
    companion = await options.companion?.start(values as never, () => started);
    if (companion !== undefined) {
      values.corsOrigins = [...values.corsOrigins, ...companion.origins.filter((origin) => !values.corsOrigins.includes(origin))];
      logger.info({ url: companion.url, origins: companion.origins }, "live page served; the services allow its origins");
    }
    for (const service of definitions) {
      const server = await service.start(values as never, logger.child({ service: service.name }));
      started.push(server);
    }
  } catch (error) {
    uninstall();
    await Promise.allSettled([...started.map((server) => server.close(false)), companion?.close()]);
    // A refusal (the state directory is taken, a setting is wrong) is said plainly; anything else
    // is a bug or an environment failure and keeps its stack in the log.
    const errno = errnoOf(error);
    if (isBerthError(error)) write(`${options.command}: ${error.message}\n`);
    else if (errno === "EADDRINUSE" || errno === "EACCES" || errno === "EADDRNOTAVAIL") {
      // The listener's message already names the address and what to change.
      write(`${options.command}: ${(error as Error).message}\n`);
    } else logger.error({ err: error }, "failed to start");
    exit(1);
    return undefined;
  }
  return started;
}

/** The errno code of an error or of the error it wraps (the listener wraps socket errors). */
function errnoOf(error: unknown): string | undefined {
  for (let e: unknown = error; e instanceof Error; e = e.cause) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === "string") return code;
  }
  return undefined;
}

/** What a service opens once it holds its state directory: its RPC services and how to close them. */
export interface OpenedService {
  readonly services: StartServerOptions["services"];
  /** Flushes and closes the domain (after the last connection closed, before the election lock goes). */
  close(): void | Promise<void>;
}

/**
 * The common start of a berth service: take the election lock of the state directory, open the
 * domain (`open`, which may read the state directory now that nobody else writes it), serve it.
 * Shutdown closes the domain, then releases the lock; a failed start undoes whatever was done.
 */
export async function serveElected(options: {
  readonly name: string;
  readonly values: CommonValues;
  readonly port: number;
  readonly socket?: string | undefined;
  readonly logger: Logger;
  readonly open: () => OpenedService | Promise<OpenedService>;
  /** Who takes the state directory's election. Default: the file backend (flock). */
  readonly elector?: Elector;
}): Promise<RunningServer> {
  const { name, values, logger } = options;
  const election = await (options.elector ?? fileElector).acquire(values.stateDir, name);
  let opened: OpenedService | undefined;
  try {
    opened = await options.open();
    const domain = opened;
    return await startServer({
      name,
      host: values.host,
      port: options.port,
      socket: options.socket,
      token: resolveToken(values),
      corsOrigins: values.corsOrigins,
      maxMessageBytes: values.maxMessageBytes,
      keepalive: { ...DEFAULT_KEEPALIVE, pingIntervalMs: values.keepalive },
      logger,
      services: domain.services,
      onShutdown: [() => domain.close(), () => election.release()],
    });
  } catch (error) {
    try {
      await opened?.close();
    } finally {
      election.release();
    }
    throw error;
  }
}
