#!/usr/bin/env node
/**
 * Bundles the compiled `berth` command (dist/main.js, from tsc) into dist/berth.js and its lazily
 * loaded chunks (dist/chunks/), which bin/berth.js runs.
 *
 * Why: Node loads an ES module graph file by file, resolving and reading each, and the Connect
 * and protobuf runtimes are some 140 small modules. Loaded as they are, they cost a client command
 * about three times a bare `node -e 0`; bundled, a command loads a handful of files. The commands'
 * dynamic imports stay chunk boundaries, so `berth --help` still loads no RPC code and each command
 * only its own service's generated code (`npm run bench -- cli` measures it).
 *
 * `berth up` runs the services themselves: they stay outside the bundle, loaded from their
 * packages when `up` runs.
 */
import { rmSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { rolldown } from "rolldown";

const dist = fileURLToPath(new URL("../dist/", import.meta.url));
rmSync(`${dist}chunks`, { recursive: true, force: true });

const bundle = await rolldown({
  input: `${dist}main.js`,
  platform: "node",
  // The services, and the server side of @berth/shared, are `berth up`'s alone: loaded from their
  // own packages (with their native addon) when it runs.
  external: [/^@berth\/(sessions|budget)(\/|$)/, /^@berth\/shared\/server\//],
  logLevel: "warn",
});
await bundle.write({
  dir: dist,
  format: "esm",
  entryFileNames: "berth.js",
  chunkFileNames: "chunks/[name]-[hash].js",
  sourcemap: true,
});
await bundle.close();
