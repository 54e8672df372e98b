#!/usr/bin/env node
/**
 * Writes src/proto-docs.json: what `proto/berth` says that the generated code does not carry, for
 * the MCP server's schemas and errors. The comments of every message, field and enum value (from
 * `buf build`'s image, which keeps the source info protoc-gen-es drops), and each
 * service's error table (the reason → "what to do" rows at the top of its proto).
 *
 * Generated, never edited: `npm run generate` runs it, and proto-docs.test.ts fails when the file
 * differs from a fresh run.
 *
 * `node packages/mcp/scripts/proto-docs.mjs [--check]`: --check prints the JSON instead of writing it.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { fromBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";

const root = fileURLToPath(new URL("../../../", import.meta.url));
const out = fileURLToPath(new URL("../src/proto-docs.json", import.meta.url));

/** The proto files of berth's own API, relative to proto/. */
function berthProtos() {
  const files = [];
  for (const service of readdirSync(`${root}proto/berth`)) {
    for (const version of readdirSync(`${root}proto/berth/${service}`)) {
      for (const name of readdirSync(`${root}proto/berth/${service}/${version}`))
        if (name.endsWith(".proto")) files.push(`berth/${service}/${version}/${name}`);
    }
  }
  return files.sort();
}

/** buf's image of proto/berth with source info: a FileDescriptorSet on the wire. */
function image() {
  const require = createRequire(import.meta.url);
  const buf = require.resolve("@bufbuild/buf/bin/buf");
  const bytes = execFileSync(buf, ["build", "--path", "proto/berth", "-o", "-#format=binpb"], { cwd: root, maxBuffer: 64 << 20 });
  return fromBinary(FileDescriptorSetSchema, new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength));
}

/** A comment as written, its `//` gone, its lines joined back with newlines, trimmed. */
function clean(text) {
  return text
    .split("\n")
    .map((line) => line.replace(/^ /, ""))
    .join("\n")
    .trim();
}

function comments(set, files) {
  const wanted = new Set(files);
  const out = {};
  for (const file of set.file) {
    if (!wanted.has(file.name)) continue;
    const byPath = new Map();
    for (const location of file.sourceCodeInfo?.location ?? []) {
      if (location.leadingComments !== undefined && location.leadingComments.trim() !== "")
        byPath.set(location.path.join("."), clean(location.leadingComments));
    }
    const put = (name, path) => {
      const text = byPath.get(path.join("."));
      if (text !== undefined) out[name] = text;
    };
    const visitEnum = (e, name, path) => {
      put(name, path);
      e.value.forEach((v, i) => put(`${name}.${v.name}`, [...path, 2, i]));
    };
    const visitMessage = (m, name, path) => {
      put(name, path);
      m.field.forEach((f, i) => put(`${name}.${f.name}`, [...path, 2, i]));
      m.nestedType.forEach((n, i) => visitMessage(n, `${name}.${n.name}`, [...path, 3, i]));
      m.enumType.forEach((e, i) => visitEnum(e, `${name}.${e.name}`, [...path, 4, i]));
    };
    file.messageType.forEach((m, i) => visitMessage(m, `${file.package}.${m.name}`, [4, i]));
    file.enumType.forEach((e, i) => visitEnum(e, `${file.package}.${e.name}`, [5, i]));
  }
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

/**
 * Each service's error tables: ErrorInfo domain (`berth.sessions`) → reason → what to do. A row
 * naming several reasons (`TOKEN_MISSING, TOKEN_INVALID`) gives each the row's advice.
 */
function errorTables(files) {
  const tables = {};
  for (const file of files) {
    const text = readFileSync(`${root}proto/${file}`, "utf8");
    const domain = /^package (berth\.[a-z]+)\.v\d+;$/m.exec(text)?.[1];
    if (domain === undefined) continue;
    for (const line of text.split("\n")) {
      const cells = /^\/\/ \| ([A-Z_, ]+?) *\| ([A-Z_, ]+?) *\| (.+?) *\|$/.exec(line);
      if (cells === null) continue;
      const advice = cells[3].replace(/`/g, "");
      for (const reason of cells[2].split(", ")) (tables[domain] ??= {})[reason] = advice;
    }
  }
  return tables;
}

const files = berthProtos();
const docs = { comments: comments(image(), files), errors: errorTables(files) };
const json = `${JSON.stringify(docs, null, 1)}\n`;
if (process.argv.includes("--check")) process.stdout.write(json);
else writeFileSync(out, json);
