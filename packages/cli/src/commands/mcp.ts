/**
 * `berth mcp`: berth as a Model Context Protocol server for a coding agent, over stdio. The agent's
 * host starts it; its tools take, hold and release locks, append to and wait on journals, and
 * reserve room in the load budget, and its resources follow them. What it holds lives as long as
 * this process: the host ending the agent's session (closing stdin, or killing it) frees it.
 *
 * This module is the command's help and command line; the server is in @berth/mcp, loaded by
 * mcp-run.ts once the command line is known to be right.
 */
import { usageError, UsageError } from "../args.js";
import { servicesCommandLine, type ServiceEndpoints } from "../run/endpoint-flags.js";
import { EXIT, type Command } from "../command.js";
import { BUDGET_ENDPOINT_FLAGS, SESSIONS_ENDPOINT_FLAGS } from "../common-help.js";
import { renderHelp } from "../help.js";

const HELP = renderHelp({
  usage: ["berth mcp [flags]"],
  about:
    "Serves berth to a coding agent as a Model Context Protocol server on stdin and stdout: tools to lock files " +
    "(held by this process until released or until it exits), append to and read session journals, wait for a " +
    "session's checkpoint, and reserve memory and cpu in the load budget; resources for a session's snapshot, the " +
    "locks and the budget, updated as they change. An agent host starts it (docs/agents.md has the configuration); " +
    "run by hand, it waits for a client on stdin.",
  flags: [
    ...SESSIONS_ENDPOINT_FLAGS.filter(([name]) => !name.startsWith("--help")),
    ...BUDGET_ENDPOINT_FLAGS.filter(([name]) => !name.startsWith("--token-file")),
  ],
  notes:
    "stdout carries the protocol's messages and nothing else; anything berth mcp has to say goes to stderr. Lock " +
    "paths are absolute or relative to the directory it runs in. It exits when stdin closes (the host ended the " +
    "session) or on SIGINT/SIGTERM, releasing what it holds; killed, the services free it all the same.",
  exitCodes: [
    [String(EXIT.ok), "stdin closed, or SIGINT/SIGTERM: everything held was released"],
    [String(EXIT.usage), "wrong flags, or a URL or token file no service can be reached with"],
  ],
  examples: ["berth mcp", "berth mcp --sessions-url unix:/run/user/1000/berth-sessions.sock --budget-url unix:/run/user/1000/berth-budget.sock"],
});

export const mcpCommand: Command = {
  name: "mcp",
  help: HELP,
  async run(argv) {
    let endpoints: ServiceEndpoints;
    try {
      ({ endpoints } = servicesCommandLine(argv));
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError("berth mcp", error.message);
    }
    // The server, the MCP SDK and the generated code load only now: help and usage errors are quick.
    const { serve } = await import("./mcp-run.js");
    return serve(endpoints);
  },
};
