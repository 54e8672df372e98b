/**
 * docs/agents.md against `berth mcp` itself: its tool list is what the server answers tools/list
 * (rendered by @berth/mcp's renderToolList), and its host configuration is JSON that starts
 * `berth mcp`.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { describe, expect, it } from "vitest";
import { Berth } from "@berth/client";
import { createBerthMcpServer, renderToolList } from "@berth/mcp";
import { repoPath } from "./harness.js";

const DOCS = repoPath("docs/agents.md");
const TOOLS_BLOCK = /(<!-- tools: generated from berth mcp's tools\/list -->\n)([\s\S]*?)(<!-- end tools -->)/;

/** The tool list as the server answers it, rendered: no service is called to list tools. */
async function renderedTools(): Promise<string> {
  const server = createBerthMcpServer({ berth: new Berth({ sessionsUrl: "http://127.0.0.1:9", budgetUrl: "http://127.0.0.1:9" }), version: "docs" });
  const [serverSide, clientSide] = InMemoryTransport.createLinkedPair();
  await server.mcp.connect(serverSide);
  const client = new Client({ name: "docs", version: "1" });
  await client.connect(clientSide);
  try {
    return renderToolList((await client.listTools()).tools as never);
  } finally {
    await client.close();
  }
}

describe("docs/agents.md", () => {
  it("lists the tools as the server answers tools/list", async () => {
    const rendered = await renderedTools();
    let docs = readFileSync(DOCS, "utf8");
    if (process.env.BERTH_UPDATE_DOCS === "1") {
      docs = docs.replace(TOOLS_BLOCK, (_, open: string, _old: string, close: string) => `${open}${rendered}${close}`);
      writeFileSync(DOCS, docs);
    }
    const block = TOOLS_BLOCK.exec(docs);
    expect(block, "docs/agents.md has no tools block").not.toBeNull();
    expect(block![2], "docs/agents.md's tool list is out of date: BERTH_UPDATE_DOCS=1 npx vitest run test/agents-docs.test.ts").toBe(rendered);
    for (const name of ["lock_acquire", "lock_append_fenced", "session_wait", "budget_reserve", "Event types", "`agent_phase`", "`checkpoint`"])
      expect(rendered).toContain(name);
  });

  it("configures a host with JSON that runs berth mcp", () => {
    const docs = readFileSync(DOCS, "utf8");
    const snippet = /```json\n(\{\n {2}"mcpServers"[\s\S]*?)\n```/.exec(docs);
    expect(snippet).not.toBeNull();
    const config = JSON.parse(snippet![1]!) as { mcpServers: { berth: { command: string; args: string[]; env: Record<string, string> } } };
    expect(config.mcpServers.berth).toMatchObject({ command: "berth", args: ["mcp"] });
    expect(Object.keys(config.mcpServers.berth.env)).toEqual(["BERTH_SESSIONS_URL", "BERTH_BUDGET_URL"]);
  });
});
