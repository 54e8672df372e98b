#!/usr/bin/env node
/**
 * Bundles the compiled `berth` command (dist/main.js, from tsc) into dist/berth.js and its lazily
 * loaded chunks (dist/chunks/), which bin/berth.js runs.
 *
 * Why: Node loads an ES module graph file by file, resolving and reading each, and the Connect
 * and protobuf runtimes are some 140 small modules. Loaded as they are, they cost a client command
 * about three times a bare `node -e 0`; bundled, a command loads a handful of files. The commands'
 * dynamic imports stay chunk boundaries, so `berth --help` still loads no RPC code and each command
 * only its own service's generated code (`npm run bench -- cli` measures it). Two more things a
 * one-RPC command paid for without using: the global `Headers` (all of undici behind it; the
 * bundle uses src/headers.ts instead) and `node:http2`/`node:https` (loaded on first use, by
 * src/lazy-builtin.ts, as is `node:http`, whose namespace loads undici on Node 22 and later). Minified without renaming: less to parse, names kept for stack traces.
 *
 * `berth up` runs the services themselves: they stay outside the bundle, loaded from their
 * packages when `up` runs.
 */
import { rmSync } from "node:fs";
import { sep } from "node:path";
import { fileURLToPath } from "node:url";
import { rolldown } from "rolldown";

const dist = fileURLToPath(new URL("../dist/", import.meta.url));
rmSync(`${dist}chunks`, { recursive: true, force: true });

// Connect's Node transports import these at the top and use them only inside functions. `node:http`
// too, though a one-call command uses it: imported as a namespace, Node 22+ reads every export of
// it, and its `WebSocket`, `CloseEvent` and `MessageEvent` getters load all of undici (with http2,
// TLS and crypto); required, it loads only itself.
const LAZY_BUILTINS = ["node:http", "node:http2", "node:https"];
const madeLazy = new Set();
/** @type {import("rolldown").Plugin} */
const lazyBuiltins = {
  name: "berth-lazy-builtins",
  transform(code, id) {
    if (!/[\\/]@connectrpc[\\/]connect-node[\\/]/.test(id)) return null;
    let changed = false;
    // In place, on the import's own line, so that the source map's lines stay right.
    const out = code.replace(/^import \* as (\w+) from "(node:[\w/]+)";$/gm, (line, local, name) => {
      if (!LAZY_BUILTINS.includes(name)) return line;
      changed = true;
      madeLazy.add(name);
      // One import name per line: a file may have several of these imports.
      return `import { lazyBuiltin as __lazy_${local} } from ${JSON.stringify(`${dist}lazy-builtin.js`)}; const ${local} = __lazy_${local}(${JSON.stringify(name)});`;
    });
    // `map: null`: the lines stay where they were, so the source map of the file still holds.
    return changed ? { code: out, map: null } : null;
  },
};

const COMMON = [
  "cli/dist/args.js",
  "cli/dist/command.js",
  "cli/dist/help.js",
  "cli/dist/common-help.js",
  "cli/dist/run/need-flags.js",
  "cli/dist/run/endpoint-flags.js",
  "client/dist/endpoint.js",
  "client/dist/service-urls.js",
  "client/dist/lock-path.js",
  "client/dist/lock-path-join.js",
  "client/dist/owner.js",
  "shared/dist/units.js",
  "shared/dist/closest.js",
].map((name) => name.split("/").join(sep));

const bundle = await rolldown({
  input: `${dist}main.js`,
  platform: "node",
  // The services, and the server side of @berth/shared, are `berth up`'s alone: loaded from their
  // own packages (with their native addon) when it runs. The live page's server reads its built
  // files beside its own package.
  external: [/^@berth\/(sessions|budget|ui)(\/|$)/, /^@berth\/shared\/server\//],
  transform: { inject: { Headers: [`${dist}headers.js`, "Headers"] } },
  plugins: [lazyBuiltins],
  // The input is tsc's output: nothing to read from a tsconfig, and the image's build context has
  // the packages' tsconfigs but not every project the root one references.
  tsconfig: false,
  logLevel: "warn",
});
await bundle.write({
  dir: dist,
  format: "esm",
  entryFileNames: "berth.js",
  chunkFileNames: "chunks/[name]-[hash].js",
  sourcemap: true,
  minify: { mangle: false },
  // The small modules most commands share (flags, help, units, finding the services), in one
  // chunk beside the entry rather than a file each: every file is one more resolve, read and link.
  codeSplitting: { groups: [{ name: "common", test: (id) => COMMON.some((name) => id.endsWith(name)) }] },
});
await bundle.close();

// A Connect release that imports them otherwise would silently bring the cost back: say so.
const missed = LAZY_BUILTINS.filter((name) => !madeLazy.has(name));
if (missed.length > 0)
  throw new Error(`bundle: no 'import * as … from "${missed.join('" / "')}"' found in @connectrpc/connect-node to load lazily; see scripts/bundle.mjs`);
