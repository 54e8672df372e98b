/**
 * A command's endpoint: its `--sessions-url`/`--budget-url` and `--token-file` flags, then the
 * environment and the defaults, by the table every berth client shares (`@berth/client/endpoint`).
 * Loads no RPC code, so a bad URL or token file is a usage error before anything else is loaded.
 */
import { EndpointError, resolveEndpoint, type Endpoint, type ServiceName } from "@berth/client/endpoint";
import { stringFlag, UsageError, type ParsedArgs } from "../args.js";

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
