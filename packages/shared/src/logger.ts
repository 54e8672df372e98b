/**
 * The one logger type of berth, for the server and the domain cores alike: pino's call shape (an
 * object of fields first, then the message), so a pino logger fits as is and a test passes
 * `pino({ level: "silent" })` or {@link silentLogger}.
 */
export interface Logger {
  debug(fields: object, message?: string): void;
  info(fields: object, message?: string): void;
  warn(fields: object, message?: string): void;
  error(fields: object, message?: string): void;
}

/** A logger that drops everything: the default when the caller passes none. */
export const silentLogger: Logger = {
  debug() {},
  info() {},
  warn() {},
  error() {},
};
