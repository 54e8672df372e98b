#!/usr/bin/env node
/** Runs the sessions service alone: `node services/sessions/dist/main.js [flags]` (`--help` lists them). */
import { runServices, tuneHeapForDaemon } from "@berth/shared/server/index";
import { sessionsService } from "./server/service.js";

tuneHeapForDaemon();
await runServices([sessionsService], { argv: process.argv.slice(2), command: "berth-sessions" });
