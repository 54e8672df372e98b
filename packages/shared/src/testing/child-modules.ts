/**
 * For tests that must run berth code in child processes (kill a writer mid-way, race 8 electors):
 * vitest runs the TypeScript sources in-process, but a plain `node` child cannot load them. This
 * strips the types of the named modules into a temp dir, without type-checking, so a child gets
 * today's code even when dist/ is stale or another module of the package does not compile yet.
 */
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import ts from "typescript";

const sourceDir = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const repoNodeModules = path.resolve(sourceDir, "../../../node_modules");

/** A temp dir of transpiled modules; `url("files")` is what a child imports. */
export interface ChildModules {
  dir: string;
  url(module: string): string;
  /** Writes a child script into the dir and returns its path. */
  script(name: string, text: string): string;
  remove(): void;
}

/** Transpiles `modules` (names of files in packages/shared/src, without extension) for child processes. */
export function transpileForChild(modules: readonly string[]): ChildModules {
  const dir = mkdtempSync(path.join(tmpdir(), "berth-child-"));
  // Bare imports (fs-ext) resolve by walking up from the importing file: point them at the repo's.
  symlinkSync(repoNodeModules, path.join(dir, "node_modules"), "dir");
  for (const name of modules) {
    const source = readFileSync(path.join(sourceDir, `${name}.ts`), "utf8");
    const output = ts.transpileModule(source, {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, verbatimModuleSyntax: true },
      fileName: `${name}.ts`,
    });
    writeFileSync(path.join(dir, `${name}.js`), output.outputText);
  }
  return {
    dir,
    url: (module) => pathToFileURL(path.join(dir, `${module}.js`)).href,
    script(name, text) {
      const file = path.join(dir, name);
      writeFileSync(file, text);
      return file;
    },
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
