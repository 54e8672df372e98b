/**
 * A command's endpoint: its `--sessions-url`/`--budget-url` and `--token-file` flags, then the
 * environment and the defaults, by the table every berth client shares (`@berth/client/endpoint`).
 * Loads no RPC code, so a bad URL or token file is a usage error before anything else is loaded.
 */
import { EndpointError, resolveEndpoint, type Endpoint, type ServiceName } from "@berth/client/endpoint";
import { parseFlags, stringFlag, UsageError, type FlagSpec, type ParsedArgs } from "../args.js";

export type { Endpoint };

/** The endpoint of `service` from the flags in `values`; throws UsageError for a URL or token file no service can be reached with. */
export function endpointFromFlags(service: ServiceName, values: ParsedArgs["values"]): Endpoint {
  try {
    return resolveEndpoint(service, { url: stringFlag(values, `${service}-url`), tokenFile: stringFlag(values, "token-file") });
  } catch (error) {
    if (error instanceof EndpointError) throw new UsageError(error.message.replace(/^the (sessions|budget) URL/, `--$1-url`));
    throw error;
  }
}

/** Both services' endpoints, for a command that calls both. */
export interface ServiceEndpoints {
  readonly sessions: Endpoint;
  readonly budget: Endpoint;
}

/** The flags of a command that calls both services: their URLs, the token file, help. */
const SERVICES_FLAGS: Readonly<Record<string, FlagSpec>> = {
  "sessions-url": { type: "string" },
  "budget-url": { type: "string" },
  "token-file": { type: "string" },
  help: { type: "boolean", short: "h" },
};

/**
 * The command line of a command that calls both services (`berth mcp`, `berth ui`): no arguments,
 * the services' flags and the command's own `flags`. Throws UsageError.
 */
export function servicesCommandLine(
  argv: readonly string[],
  flags: Readonly<Record<string, FlagSpec>> = {},
): { readonly endpoints: ServiceEndpoints; readonly values: ParsedArgs["values"] } {
  const { values } = parseFlags(argv, { ...flags, ...SERVICES_FLAGS }, false);
  return { endpoints: { sessions: endpointFromFlags("sessions", values), budget: endpointFromFlags("budget", values) }, values };
}
