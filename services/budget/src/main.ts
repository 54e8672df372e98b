#!/usr/bin/env node
/** Runs the budget service alone: `node services/budget/dist/main.js [flags]` (`--help` lists them). */
import { runServices, tuneHeapForDaemon } from "@berth/shared/server/index";
import { budgetService } from "./server/service.js";

tuneHeapForDaemon();
await runServices([budgetService], { argv: process.argv.slice(2), command: "berth-budget" });
