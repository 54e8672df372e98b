/**
 * The error table at the top of each service's proto is the one list of the reasons that service
 * sends and what to do about each. This reads every refusal the code can raise (each
 * `new BerthError(code, …, …, { reason })`, the budget's refusal specs, the reasons every server
 * shares) and holds the tables to it: every reason a service sends is in its table, with the code
 * it is sent with, one code per reason; and every reason in a table is one the code sends.
 */
import { readdirSync, readFileSync, statSync } from "node:fs";
import ts from "typescript";
import { describe, expect, it } from "vitest";
import { repoPath } from "./harness/repo.js";

type Domain = "berth.sessions" | "berth.locks" | "berth.budget";
const DOMAINS: readonly Domain[] = ["berth.sessions", "berth.locks", "berth.budget"];

const PROTOS: Record<Domain, string> = {
  "berth.sessions": "proto/berth/sessions/v1/session_service.proto",
  "berth.locks": "proto/berth/locks/v1/lock_service.proto",
  "berth.budget": "proto/berth/budget/v1/budget_service.proto",
};

/** The domain whose errors a source file raises; "all" for the code every service shares. */
function domainOf(file: string): Domain | "all" | "etcd" {
  if (file.startsWith("packages/shared/")) return "all";
  if (file.startsWith("packages/etcd/")) return "etcd";
  if (file.startsWith("services/budget/")) return "berth.budget";
  if (/^services\/sessions\/src\/(locks\/|server\/lock-handlers\.ts|etcd\/etcd-(source-)?locks\.ts)/.test(file)) return "berth.locks";
  return "berth.sessions";
}

/**
 * Reasons raised but never answered to a call, so in no table. Each says why; a reason here that
 * a table lists, or one that is gone from the code, fails the test too.
 */
const NEVER_ANSWERED: Readonly<Record<string, string>> = {
  ETCD_COMPACTED: "the etcd store turns a compacted watch into WATCHER_LAGGED",
  UNSUPPORTED_SETTINGS: "a setting etcd's version cannot honour: the service refuses to start",
  MACHINE_NAME_TAKEN: "two budgets publishing one machine name: raised while publishing, not by a call",
  RUNNING_NOT_FOUND: "KeepAlive answers alive = false and StopRunning stopped = false instead",
};

/** Reasons of the etcd client that a domain's calls can meet (on `--store etcd`); the others meet none. */
const ETCD_REASONS_BY_DOMAIN: Record<Domain, readonly string[]> = {
  "berth.sessions": ["ETCD_UNAVAILABLE", "REQUEST_TOO_LARGE", "ETCD_TOO_MANY_TXN_OPS", "ETCD_NO_SPACE", "ETCD_AUTH", "ETCD_ERROR"],
  "berth.locks": ["ETCD_UNAVAILABLE", "ETCD_LEASE_LOST", "ETCD_NO_SPACE", "ETCD_AUTH", "ETCD_ERROR"],
  // GetFleet only reads; the fleet's writes happen while publishing, not in a call.
  "berth.budget": ["ETCD_UNAVAILABLE", "ETCD_AUTH", "ETCD_ERROR"],
};

/** Reasons and codes every server gives without a BerthError of its own (connect-errors.ts's reasons of codes). */
const SERVER_REASONS: ReadonlyArray<readonly [string, string]> = [
  ["UNAVAILABLE", "SHUTTING_DOWN"],
  ["CANCELLED", "CANCELLED"],
  ["DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED"],
  ["INTERNAL", "INTERNAL"],
  ["INVALID_ARGUMENT", "INVALID_FIELD"],
  ["UNAUTHENTICATED", "TOKEN_MISSING"],
  ["UNAUTHENTICATED", "TOKEN_INVALID"],
];

function sources(dir: string, out: string[] = []): string[] {
  for (const name of readdirSync(repoPath(dir))) {
    const rel = `${dir}/${name}`;
    if (["node_modules", "dist", "testing", "gen"].includes(name)) continue;
    if (statSync(repoPath(rel)).isDirectory()) sources(rel, out);
    else if (rel.endsWith(".ts") && !rel.endsWith(".test.ts") && !rel.endsWith(".d.ts")) out.push(rel);
  }
  return out;
}

interface Raised {
  readonly file: string;
  readonly code: string;
  readonly reason: string;
}

/** Every `{ reason }` a BerthError or a refusal spec is given, with its code, across the sources. */
function raisedReasons(): Raised[] {
  const files = ["packages/shared/src", "packages/etcd/src", "services/sessions/src", "services/budget/src"].flatMap((dir) => sources(dir));
  const parse = (file: string) => ({ file, source: ts.createSourceFile(file, readFileSync(repoPath(file), "utf8"), ts.ScriptTarget.Latest, true) });
  const parsed = files.map(parse);
  // Reasons named through a constant, or a constant object (`ANY_CALL_REASONS.MALFORMED_REQUEST`, `EtcdReason.AUTH`),
  // the wire's tables included; a constant may name another (`AUTH: ANY_CALL_REASONS.ETCD_AUTH`).
  const constants = new Map<string, string>();
  const aliases = new Map<string, string>();
  for (const { source } of [...parsed, ...sources("packages/wire/src").map(parse)]) {
    const visit = (node: ts.Node): void => {
      if (ts.isVariableDeclaration(node) && ts.isIdentifier(node.name) && node.initializer !== undefined) {
        let init = node.initializer;
        if (ts.isAsExpression(init)) init = init.expression;
        // …or a plain one (`export const TOO_MANY_OPEN_FILES = "TOO_MANY_OPEN_FILES"`).
        if (ts.isStringLiteral(init) && /^[A-Z][A-Z0-9_]+$/.test(init.text)) constants.set(node.name.text, init.text);
        if (ts.isObjectLiteralExpression(init)) {
          for (const p of init.properties) {
            if (!ts.isPropertyAssignment(p)) continue;
            const name = `${node.name.text}.${p.name.getText(source)}`;
            if (ts.isStringLiteral(p.initializer) && /^[A-Z][A-Z0-9_]+$/.test(p.initializer.text)) constants.set(name, p.initializer.text);
            else if (ts.isPropertyAccessExpression(p.initializer)) aliases.set(name, p.initializer.getText(source));
          }
        }
      }
      ts.forEachChild(node, visit);
    };
    visit(source);
  }
  for (const [name, target] of aliases) {
    const value = constants.get(target);
    if (value !== undefined) constants.set(name, value);
  }
  const reasonOf = (expression: ts.Expression, source: ts.SourceFile): string | undefined =>
    ts.isStringLiteral(expression) ? expression.text : constants.get(expression.getText(source));
  const raised: Raised[] = [];
  for (const { file, source } of parsed) {
    const visit = (node: ts.Node): void => {
      // `new BerthError(…)`, or `super(…)` in a subclass of it.
      const construction =
        (ts.isNewExpression(node) && node.expression.getText(source) === "BerthError") ||
        (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.SuperKeyword);
      if (construction) {
        const [code, , , options] = (node as ts.NewExpression | ts.CallExpression).arguments ?? [];
        if (code !== undefined && ts.isStringLiteral(code) && options !== undefined && ts.isObjectLiteralExpression(options)) {
          for (const p of options.properties) {
            if (ts.isPropertyAssignment(p) && p.name.getText(source) === "reason") {
              const reason = reasonOf(p.initializer, source);
              if (reason !== undefined) raised.push({ file, code: code.text, reason });
            }
          }
        }
      }
      // A table of refusals: `{ code: "resource_exhausted", …, reason: "QUEUE_FULL" }`.
      if (ts.isObjectLiteralExpression(node)) {
        const props = new Map(node.properties.filter(ts.isPropertyAssignment).map((p) => [p.name.getText(source), p.initializer]));
        const code = props.get("code");
        const reason = props.get("reason");
        const named = reason === undefined ? undefined : reasonOf(reason, source);
        if (code !== undefined && ts.isStringLiteral(code) && named !== undefined) raised.push({ file, code: code.text, reason: named });
      }
      ts.forEachChild(node, visit);
    };
    visit(source);
  }
  return raised;
}

/** A proto's error tables: reason → the codes it is listed with. */
function documented(domain: Domain): Map<string, Set<string>> {
  const rows = new Map<string, Set<string>>();
  const text = readFileSync(repoPath(PROTOS[domain]), "utf8");
  const header = text.slice(0, text.indexOf("\nservice "));
  for (const line of header.split("\n")) {
    const cells = /^\/\/ \| ([A-Z_, ]+?) *\| ([A-Z_, ]+?) *\|/.exec(line);
    if (cells === null || cells[1] === "code") continue;
    const codes = cells[1]!.split(", ");
    const reasons = cells[2]!.split(", ");
    // `CANCELLED, DEADLINE_EXCEEDED | CANCELLED, DEADLINE_EXCEEDED`: pairwise; otherwise every reason with the one code.
    reasons.forEach((reason, i) => rows.set(reason, new Set([...(rows.get(reason) ?? []), codes.length === reasons.length ? codes[i]! : codes[0]!])));
  }
  return rows;
}

const raised = raisedReasons();
const upper = (code: string) => code.toUpperCase();

describe("the error tables of the protos", () => {
  it("found the refusals in the code (the scan works)", () => {
    const reasons = new Set(raised.map((r) => r.reason));
    for (const reason of ["SEQ_CONFLICT", "WAIT_EXHAUSTED", "QUEUE_FULL", "MALFORMED_REQUEST", "MESSAGE_TOO_LARGE", "DISK_FULL", "ETCD_UNAVAILABLE"]) {
      expect(reasons, reason).toContain(reason);
    }
  });

  it("gives each reason one code wherever it is raised", () => {
    const codes = new Map<string, Set<string>>();
    for (const { code, reason } of raised) codes.set(reason, new Set([...(codes.get(reason) ?? []), code]));
    const several = [...codes].filter(([, set]) => set.size > 1).map(([reason, set]) => `${reason}: ${[...set].join(", ")}`);
    expect(several).toEqual([]);
  });

  it.each(DOMAINS)("%s: every reason its calls can get is in its table, with its code", (domain) => {
    const table = documented(domain);
    const missing: string[] = [];
    const expectRow = (code: string, reason: string, where: string) => {
      if (!table.get(reason)?.has(code)) missing.push(`${code} ${reason} (${where})`);
    };
    for (const { file, code, reason } of raised) {
      if (reason in NEVER_ANSWERED) continue;
      const owner = domainOf(file);
      if (owner === domain || owner === "all") expectRow(upper(code), reason, file);
      if (owner === "etcd" && ETCD_REASONS_BY_DOMAIN[domain].includes(reason)) expectRow(upper(code), reason, file);
    }
    for (const [code, reason] of SERVER_REASONS) expectRow(code, reason, "every server");
    expect(missing).toEqual([]);
  });

  it.each(DOMAINS)("%s: every reason in its table is one the code sends", (domain) => {
    const sent = new Set([...raised.map((r) => r.reason), ...SERVER_REASONS.map(([, reason]) => reason)]);
    const stale = [...documented(domain).keys()].filter((reason) => !sent.has(reason));
    expect(stale).toEqual([]);
    expect([...documented(domain).keys()].filter((reason) => reason in NEVER_ANSWERED)).toEqual([]);
  });

  it("lists as never answered only reasons the code raises", () => {
    const reasons = new Set(raised.map((r) => r.reason));
    expect(Object.keys(NEVER_ANSWERED).filter((reason) => !reasons.has(reason))).toEqual([]);
  });
});
