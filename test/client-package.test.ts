/**
 * `@berth/client`, `@berth/wire` and `@berth/api` as npm would publish them: the tarball holds every file an
 * `exports` entry names (the JavaScript and its types), the README, and no tests; every package a
 * packed file imports is a declared dependency, so an install from the registry runs.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { builtinModules } from "node:module";
import { describe, expect, it } from "vitest";

const ROOT = path.resolve(import.meta.dirname, "..");

/** An exports target: a path, or paths by condition (nested: `"browser": { "types", "default" }`). */
type ExportTarget = string | { [condition: string]: ExportTarget };

/** Every path an exports target names, under every condition. */
function targetPaths(target: ExportTarget): string[] {
  return typeof target === "string" ? [target] : Object.values(target).flatMap(targetPaths);
}

interface Manifest {
  name: string;
  private?: boolean;
  exports: Record<string, ExportTarget>;
  dependencies?: Record<string, string>;
}

function packedFiles(workspace: string): string[] {
  const out = execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts", "-w", workspace], { cwd: ROOT, encoding: "utf8" });
  const [entry] = JSON.parse(out) as { files: { path: string }[] }[];
  return entry!.files.map((f) => f.path);
}

/** The package names a module imports (static, dynamic and re-exports), builtins left out. */
function importedPackages(source: string): Set<string> {
  const found = new Set<string>();
  for (const m of source.matchAll(/(?:\bfrom\s*|\bimport\s*\(?\s*)["']([^"'.][^"']*)["']/g)) {
    const spec = m[1]!;
    if (spec.startsWith("node:") || builtinModules.includes(spec)) continue;
    const parts = spec.split("/");
    found.add(spec.startsWith("@") ? `${parts[0]}/${parts[1]}` : parts[0]!);
  }
  return found;
}

describe.each(["packages/client", "packages/wire", "packages/api"])("%s, packed", (workspace) => {
  const dir = path.join(ROOT, workspace);
  const manifest = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8")) as Manifest;
  const files = packedFiles(workspace);

  it("is publishable: not private, a README, no tests", () => {
    expect(manifest.private).toBeUndefined();
    expect(files).toContain("README.md");
    expect(files.filter((f) => /\.test\.|\.tsbuildinfo$|^src\//.test(f))).toEqual([]);
  });

  it("holds what every exports entry names, JavaScript and types", () => {
    const targets = Object.values(manifest.exports).flatMap(targetPaths);
    expect(targets.length).toBeGreaterThan(0);
    for (const target of targets) {
      const pattern = new RegExp(
        `^${target
          .replace(/^\.\//, "")
          .replace(/[.+?^${}()|[\]\\]/g, "\\$&")
          .replace(/\*/g, ".+")}$`,
      );
      expect(
        files.some((f) => pattern.test(f)),
        `${manifest.name}: nothing packed for exports target ${target}`,
      ).toBe(true);
    }
    const js = files.filter((f) => f.endsWith(".js"));
    expect(js.length).toBeGreaterThan(0);
    for (const f of js) expect(files, `${f} has no types`).toContain(f.replace(/\.js$/, ".d.ts"));
  });

  it("declares every package its packed files import", () => {
    const declared = new Set(Object.keys(manifest.dependencies ?? {}));
    const missing = new Set<string>();
    for (const f of files.filter((f) => /\.(js|d\.ts)$/.test(f))) {
      for (const pkg of importedPackages(readFileSync(path.join(dir, f), "utf8"))) {
        if (pkg !== manifest.name && !declared.has(pkg)) missing.add(`${pkg} (${f})`);
      }
    }
    expect([...missing]).toEqual([]);
  });
});
