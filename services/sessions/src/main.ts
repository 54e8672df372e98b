#!/usr/bin/env node
/** Runs the sessions service alone: `node services/sessions/dist/main.js [flags]` (`--help` lists them). */
import { tuneHeapForDaemon } from "@berth/shared/server/heap-tuning";

// Before anything else is loaded: V8 reads some of these flags only until its first full collection.
tuneHeapForDaemon();
const { runServices } = await import("@berth/shared/server/index");
const { sessionsService } = await import("./server/service.js");
await runServices([sessionsService], { argv: process.argv.slice(2), command: "berth-sessions" });
