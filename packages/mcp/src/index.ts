/**
 * `@berth/mcp`: berth as a Model Context Protocol server for coding agents (`berth mcp` serves it
 * over stdio). Tools for the locks, journals and budget, subscribable resources, errors with the
 * reason and what to do.
 */
export { createBerthMcpServer, type BerthMcpOptions, type BerthMcpServer } from "./server.js";
export { describeFailure, toolError, type ToolFailure } from "./errors.js";
export { renderToolList } from "./tool-list.js";
export { BUDGET_URI, LOCKS_URI, SESSION_URI_TEMPLATE } from "./resources.js";
export { TOOLS } from "./tools.js";
