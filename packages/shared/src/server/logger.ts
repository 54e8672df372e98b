/**
 * The logger the server writes to: pino's, or anything with the same call shape (tests pass
 * `pino({ level: "silent" })`).
 */

/** A pino-style log method: an object of fields first, then the message. */
export type LogMethod = (fields: Record<string, unknown>, message?: string) => void;

/** The part of a pino `Logger` the server uses. */
export interface ServerLogger {
  debug: LogMethod;
  info: LogMethod;
  warn: LogMethod;
  error: LogMethod;
}
