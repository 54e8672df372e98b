/** Help rows several commands share: how to reach a service, and the exit codes of a failed call. */
import { DEFAULT_URLS } from "@berth/client/endpoint";
import { EXIT } from "./command.js";
import type { HelpRow } from "./help.js";

/** Where the sessions service is when neither a flag nor the environment says. */
export const DEFAULT_SESSIONS_URL = DEFAULT_URLS.sessions;
/** Where the budget service is when neither a flag nor the environment says. */
export const DEFAULT_BUDGET_URL = DEFAULT_URLS.budget;

/** `--sessions-url`, `--token-file`, `--help`. */
export const SESSIONS_ENDPOINT_FLAGS: readonly HelpRow[] = [
  [
    "--sessions-url URL",
    `the sessions service: http://HOST:PORT or unix:/path/to/socket (else BERTH_SESSIONS_URL, BERTH_SESSIONS_SOCKET, BERTH_HOST and BERTH_SESSIONS_PORT; default ${DEFAULT_SESSIONS_URL})`,
  ],
  ["--token-file FILE", "file holding the bearer token (else BERTH_TOKEN_FILE, then BERTH_TOKEN)"],
  ["--help, -h", "this help"],
];

/** `--budget-url`, `--token-file`, `--help`. */
export const BUDGET_ENDPOINT_FLAGS: readonly HelpRow[] = [
  [
    "--budget-url URL",
    `the budget service: http://HOST:PORT or unix:/path/to/socket (else BERTH_BUDGET_URL, BERTH_BUDGET_SOCKET, BERTH_HOST and BERTH_BUDGET_PORT; default ${DEFAULT_BUDGET_URL})`,
  ],
  ["--token-file FILE", "file holding the bearer token (else BERTH_TOKEN_FILE, then BERTH_TOKEN)"],
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
