/**
 * A page's module bundled for the browser as the page's own bundler would: rolldown on the
 * `browser` platform (`@berth/client` resolves to its browser entry), minified, one ES module. The
 * Chromium tests inline it in their pages; the web client's benchmark weighs it.
 */
import * as path from "node:path";
import { rolldown } from "rolldown";

/** A bundle: its code and the modules in it (absolute paths, or `node:…` for a built-in). */
export interface BrowserBundle {
  readonly code: string;
  readonly modules: readonly string[];
}

/**
 * `source` bundled, its imports resolved as from a module in `directory` (from the packages'
 * dist/: build first). Throws if it holds a Node built-in or connect-node: a page cannot load them.
 */
export async function bundleForBrowser(source: string, directory: string): Promise<BrowserBundle> {
  // A module that is not on disk, named as if in `directory`, so that its imports resolve from there.
  const entry = path.join(directory, "page-entry.js");
  const bundle = await rolldown({
    input: entry,
    platform: "browser",
    tsconfig: false,
    logLevel: "warn",
    plugins: [{ name: "page-entry", resolveId: (id) => (id === entry ? id : null), load: (id) => (id === entry ? source : null) }],
  });
  try {
    const { output } = await bundle.generate({ format: "esm", minify: true });
    const [chunk] = output;
    const modules = chunk.moduleIds.filter((id) => id !== entry);
    const fromNode = modules.filter((id) => id.startsWith("node:") || /[\\/]@connectrpc[\\/]connect-node[\\/]/.test(id));
    if (fromNode.length > 0) throw new Error(`a page cannot load ${fromNode.join(", ")}: the bundle of ${JSON.stringify(source)} holds them`);
    return { code: chunk.code, modules };
  } finally {
    await bundle.close();
  }
}
