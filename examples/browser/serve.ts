/**
 * Serves examples/browser on loopback, as a tool's dev server would: index.html, and page.ts
 * bundled for the browser by rolldown (`@berth/client` resolves to its browser entry; nothing of
 * Node goes in). The page calls the sessions service from its own origin, so the service must allow
 * that origin: the script prints the command.
 *
 *   npm run example:browser                            # http://127.0.0.1:7400
 *   node examples/browser/dist/serve.js --port 0       # any free port
 */
import { readFile } from "node:fs/promises";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { rolldown } from "rolldown";

/** The example's folder (this file runs from its dist/). */
const folder = new URL("../", import.meta.url);

const { values } = parseArgs({ options: { port: { type: "string", default: "7400" } } });
const port = Number(values.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port: a port number, got ${JSON.stringify(values.port)}`);

/** page.ts as one ES module for the browser, and its source map (the browser's devtools show page.ts). */
async function bundlePage(): Promise<{ code: string; map: string }> {
  const bundle = await rolldown({ input: new URL("page.ts", folder).pathname, platform: "browser", logLevel: "warn" });
  try {
    const { output } = await bundle.generate({ format: "esm", sourcemap: true, entryFileNames: "page.js" });
    return { code: output[0].code, map: output[0].map?.toString() ?? "" };
  } finally {
    await bundle.close();
  }
}

const [html, page] = await Promise.all([readFile(new URL("index.html", folder), "utf8"), bundlePage()]);
const files = new Map([
  ["/", { type: "text/html; charset=utf-8", text: html }],
  ["/page.js", { type: "text/javascript", text: page.code }],
  ["/page.js.map", { type: "application/json", text: page.map }],
]);

const server = http.createServer((request, response) => {
  const body = files.get(new URL(request.url ?? "/", "http://page").pathname);
  if (request.method !== "GET" || body === undefined) {
    response.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
    return;
  }
  // no-store: a reload after a restart of this script gets the page just bundled.
  response.writeHead(200, { "content-type": body.type, "cache-control": "no-store", "x-content-type-options": "nosniff" }).end(body.text);
});
// Loopback only: the page is for the person at this machine.
server.listen(port, "127.0.0.1", () => {
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  console.log(`examples/browser: ${origin}/?session=demo`);
  console.log(`the sessions service must allow this origin: npx berth up --cors-origin ${origin}`);
  console.log(`with a token, give it after #: ${origin}/?session=demo#token=…`);
});
