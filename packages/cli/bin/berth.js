#!/usr/bin/env node
// The `berth` command. npm links a workspace's bin when it installs, before `prepare` compiles
// dist/, so the link must point at a file in git: this one, which runs the compiled command.
import { fileURLToPath } from "node:url";

const main = new URL("../dist/main.js", import.meta.url);
try {
  await import(main.href);
} catch (error) {
  if (error?.code === "ERR_MODULE_NOT_FOUND" && String(error.message).includes(fileURLToPath(main))) {
    process.stderr.write(`berth: the command is not built yet (${fileURLToPath(main)} is missing): run 'npm run build' in the berth checkout\n`);
    process.exit(70);
  }
  throw error;
}
