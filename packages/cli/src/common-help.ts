/** Help rows several commands share: how to reach a service, and the exit codes of a failed call. */
import { EXIT } from "./command.js";
import type { HelpRow } from "./help.js";

/** Where the sessions service is when neither `--sessions-url` nor `BERTH_SESSIONS_URL` says. */
export const DEFAULT_SESSIONS_URL = "http://127.0.0.1:7301";
/** Where the budget service is when neither `--budget-url` nor `BERTH_BUDGET_URL` says. */
export const DEFAULT_BUDGET_URL = "http://127.0.0.1:7302";

/** `--sessions-url`, `--token-file`, `--help`. */
export const SESSIONS_ENDPOINT_FLAGS: readonly HelpRow[] = [
  ["--sessions-url URL", `the sessions service: http://HOST:PORT or unix:/path/to/socket (env BERTH_SESSIONS_URL; default ${DEFAULT_SESSIONS_URL})`],
  ["--token-file FILE", "file holding the bearer token (else env BERTH_TOKEN_FILE, or BERTH_TOKEN)"],
  ["--help, -h", "this help"],
];

/** `--budget-url`, `--token-file`, `--help`. */
export const BUDGET_ENDPOINT_FLAGS: readonly HelpRow[] = [
  ["--budget-url URL", `the budget service: http://HOST:PORT or unix:/path/to/socket (env BERTH_BUDGET_URL; default ${DEFAULT_BUDGET_URL})`],
  ["--token-file FILE", "file holding the bearer token (else env BERTH_TOKEN_FILE, or BERTH_TOKEN)"],
  ["--help, -h", "this help"],
];

/** The exit codes of a call that failed, for the service named. */
export function callExitRows(service: "sessions" | "budget"): HelpRow[] {
  return [
    [String(EXIT.usage), `wrong flags or arguments (also an argument the ${service} service refused)`],
    [String(EXIT.unreachable), `the ${service} service cannot be reached, is shutting down or did not answer`],
    [String(EXIT.denied), "the service wants a bearer token (BERTH_TOKEN, --token-file)"],
    [String(EXIT.failed), "the service failed otherwise (the message says how)"],
  ];
}
