/**
 * berth as an MCP server: the tools (tools.ts) and the resources (resources.ts) on one McpServer,
 * over the Berth clients given. The transport is the caller's: `berth mcp` connects it to stdio, the
 * tests and the docs' tool list to an in-memory pair.
 */
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { defaultOwner, type Berth } from "@berth/client";
import { Holdings } from "./holdings.js";
import { registerResources } from "./resources.js";
import { runTool, TOOLS, type ToolContext } from "./tools.js";

/** What the server runs on. */
export interface BerthMcpOptions {
  /** The clients of the services (their endpoints resolved as every berth client's). */
  readonly berth: Berth;
  /** The server's version, as initialize answers it. */
  readonly version: string;
  /** Where the server's own messages go: stderr (stdout is the protocol's). */
  readonly log?: (message: string) => void;
}

/** The MCP server, what it holds, and how to let go of it all. */
export interface BerthMcpServer {
  readonly mcp: McpServer;
  readonly holdings: Holdings;
  /** Ends the subscriptions' watches and releases every lock and reservation held here. */
  close(): Promise<void>;
}

const INSTRUCTIONS =
  "berth coordinates the agents, tools and people working on one machine. Before editing a file others may edit, lock_acquire it " +
  "(you wait in line; release with lock_release) and write session events under it with lock_append_fenced. Publish your progress with " +
  "session_append (agent_phase, variants_ready, agent_done, agent_error) and wait for the browser's checkpoint with session_wait. Before " +
  "heavy work (a build, tests), budget_reserve memory and cpu; budget_release after. What you hold is freed when this session ends. " +
  "A tool error names the reason and what to do.";

/** Makes the server; connect `mcp` to a transport to serve. */
export function createBerthMcpServer(options: BerthMcpOptions): BerthMcpServer {
  const log = options.log ?? ((message: string) => process.stderr.write(`${message}\n`));
  const mcp = new McpServer(
    { name: "berth", title: "berth: source locks, session journals and the load budget", version: options.version },
    { instructions: INSTRUCTIONS },
  );
  const holdings = new Holdings();
  const agent = () => mcp.server.getClientVersion()?.name;
  const context: ToolContext = {
    berth: options.berth,
    holdings,
    owner: () => `berth mcp for ${agent() ?? "an agent"} (${defaultOwner()})`,
  };
  for (const tool of TOOLS) {
    mcp.registerTool(tool.name, { title: tool.title, description: tool.description, inputSchema: tool.input, annotations: tool.annotations }, (args, extra) =>
      runTool(tool, args as Record<string, unknown>, context, extra),
    );
  }
  const resources = registerResources(mcp, { berth: options.berth, holdings, log });
  return {
    mcp,
    holdings,
    async close() {
      resources.close();
      await holdings.releaseAll();
    },
  };
}
