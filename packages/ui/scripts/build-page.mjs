#!/usr/bin/env node
/**
 * Builds the live page into dist/page/ (index.html, page.js, page.css): at `npm install` (the
 * root's build), so `berth ui` serves it with no network and no bundler at run time. One ES
 * module, minified, from src/page/main.tsx (Preact, uPlot, @berth/client's browser entry); one
 * stylesheet, uPlot's and the page's. `npm run bench -- ui` weighs what it writes.
 */
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { rolldown } from "rolldown";

const root = fileURLToPath(new URL("../", import.meta.url));
const out = `${root}dist/page/`;
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const bundle = await rolldown({
  input: `${root}src/page/main.tsx`,
  platform: "browser",
  tsconfig: `${root}src/page/tsconfig.json`,
  logLevel: "warn",
});
try {
  // BERTH_PAGE_MINIFY=0 keeps the names, for a profile of the page (npm run bench -- ui --profile).
  const { output } = await bundle.generate({ format: "esm", minify: process.env.BERTH_PAGE_MINIFY !== "0" });
  const [chunk, ...rest] = output;
  if (rest.some((item) => item.type === "chunk")) throw new Error("the page must be one module: a dynamic import split it");
  const fromNode = chunk.moduleIds.filter((id) => id.startsWith("node:") || /[\\/]@connectrpc[\\/]connect-node[\\/]/.test(id));
  if (fromNode.length > 0) throw new Error(`the page cannot load ${fromNode.join(", ")}`);
  writeFileSync(`${out}page.js`, chunk.code);
} finally {
  await bundle.close();
}

const require = createRequire(import.meta.url);
const uplotCss = readFileSync(require.resolve("uplot/dist/uPlot.min.css"), "utf8");
writeFileSync(`${out}page.css`, `${uplotCss}\n${readFileSync(`${root}src/page/page.css`, "utf8")}`);
copyFileSync(`${root}src/page/index.html`, `${out}index.html`);
