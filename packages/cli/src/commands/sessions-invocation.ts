import type { ParsedArgs } from "../args.js";
import type { Endpoint } from "../run/endpoint-flags.js";

export type SubcommandName = "append" | "get" | "list" | "delete" | "watch" | "journal";

/** What a subcommand gets: its parsed flags and positionals, and where the service is. */
export interface SessionsInvocation {
  readonly subcommand: SubcommandName;
  readonly values: ParsedArgs["values"];
  readonly positionals: string[];
  readonly endpoint: Endpoint;
  readonly json: boolean;
}
