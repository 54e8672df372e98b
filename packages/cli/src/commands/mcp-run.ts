/**
 * `berth mcp`'s server on stdio. stdout is the protocol's alone: console output is sent to stderr
 * before anything else loads, so that no library's log line can corrupt a message.
 */
import { readFileSync } from "node:fs";
import { Berth, type Endpoint } from "@berth/client";
import { createBerthMcpServer } from "@berth/mcp";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { EXIT } from "../command.js";

/** berth's version: this module is two levels below the command's package.json both compiled (dist/commands/) and bundled (dist/chunks/). */
function version(): string {
  try {
    return (JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version?: string }).version ?? "unknown";
  } catch {
    return "unknown";
  }
}

/** Serves until stdin closes or a signal; resolves "serving" (the process exits on its own). */
export async function serve(endpoints: { readonly sessions: Endpoint; readonly budget: Endpoint }): Promise<"serving"> {
  for (const method of ["log", "info", "debug"] as const) console[method] = console.error;
  const berth = new Berth({ sessionsUrl: endpoints.sessions.url, budgetUrl: endpoints.budget.url, token: endpoints.sessions.token });
  const server = createBerthMcpServer({ berth, version: version() });
  const transport = new StdioServerTransport();
  let ending = false;
  const end = async (code: number) => {
    if (ending) return;
    ending = true;
    await server.close().catch(() => {});
    process.exit(code);
  };
  // The host ended the session: it closed our stdin (the transport alone would not notice).
  process.stdin.once("end", () => void end(EXIT.ok));
  process.stdin.once("close", () => void end(EXIT.ok));
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.once(signal, () => void end(EXIT.ok));
  transport.onerror = (error) => process.stderr.write(`berth mcp: ${error.message}\n`);
  await server.mcp.connect(transport);
  return "serving";
}
