#!/usr/bin/env node
// The `berth` command. npm links a workspace's bin when it installs, before `prepare` compiles
// dist/, so the link must point at a file in git: this one, which runs the compiled command, as the
// build bundles it (dist/berth.js: a few files to load instead of some 150 modules; scripts/bundle.mjs).
import module from "node:module";
import { fileURLToPath } from "node:url";

// Node 22.1+ keeps V8's compiled code of the modules below on disk (in the temp directory, or
// NODE_COMPILE_CACHE), so later runs skip compiling them; Node 20 has no such cache.
module.enableCompileCache?.();

const main = new URL("../dist/berth.js", import.meta.url);
try {
  await import(main.href);
} catch (error) {
  if (error?.code === "ERR_MODULE_NOT_FOUND" && String(error.message).includes(fileURLToPath(main))) {
    process.stderr.write(`berth: the command is not built yet (${fileURLToPath(main)} is missing): run 'npm run build' in the berth checkout\n`);
    process.exit(70);
  }
  throw error;
}
