/**
 * What `@berth/client` costs a web page: its browser entry bundled as a page's bundler would
 * (rolldown, the `browser` platform, minified: `@berth/shared/testing/browser-bundle`), in bytes
 * and gzipped bytes (level 9), for
 *
 * - `whole entry`: everything `@berth/client/web` exports (a page that uses it all);
 * - `sessions client only`: a page that imports `SessionsClient` alone, which shows what tree
 *   shaking leaves out (the locks' and the budget's clients and generated code).
 *
 * One JSON line per bundle, with the number of modules in it; fails if a bundle would load a Node
 * module. Built from the packages' dist/ (`npm run bench` builds first).
 *
 * `npm run bench -- web-client`
 */
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { bundleForBrowser } from "@berth/shared/testing/browser-bundle";
import { emit } from "../lib/report.js";

/** Where a page's imports resolve from: the bench's own directory in the repository. */
const BENCH_DIR = fileURLToPath(new URL("../..", import.meta.url));

const PAGES: readonly { readonly bundle: string; readonly source: string }[] = [
  { bundle: "whole entry", source: `export * from "@berth/client/web";` },
  { bundle: "sessions client only", source: `export { SessionsClient } from "@berth/client/web";` },
];

/** Runs the suite. */
export async function run(args: string[] = []): Promise<void> {
  if (args.length > 0) throw new Error(`unknown flag ${args[0]}; this suite takes none`);
  for (const page of PAGES) {
    const { code, modules } = await bundleForBrowser(page.source, BENCH_DIR);
    emit({
      suite: "web-client",
      bundle: page.bundle,
      source: page.source,
      modules: modules.length,
      bytes: Buffer.byteLength(code),
      gzip_bytes: gzipSync(code, { level: 9 }).length,
    });
  }
}
