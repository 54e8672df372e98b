#!/usr/bin/env node
/** Runs the budget service alone: `node services/budget/dist/main.js [flags]` (`--help` lists them). */
import { tuneHeapForDaemon } from "@berth/shared/server/heap-tuning";

// Before anything else is loaded: V8 reads some of these flags only until its first full collection.
tuneHeapForDaemon();
const { runServices } = await import("@berth/shared/server/index");
const { budgetService } = await import("./server/service.js");
await runServices([budgetService], { argv: process.argv.slice(2), command: "berth-budget" });
