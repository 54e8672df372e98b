/**
 * The reason tables against the protos' lists: each service's proto comment holds "the one list of
 * reasons and what to do" and the reasons of any call; a reason in a table and not in its proto (or
 * the other way) is drift between what berth sends and what it documents.
 */
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ANY_CALL_REASONS, BUDGET_REASONS, LOCKS_REASONS, SESSIONS_REASONS } from "./reasons.js";

const PROTO = new URL("../../../proto/berth/", import.meta.url);

/** The reasons in the `| code | reason | what to do |` tables of a proto's comments. */
function documentedReasons(path: string): Set<string> {
  const found = new Set<string>();
  for (const line of readFileSync(new URL(path, PROTO), "utf8").split("\n")) {
    const row = /^\/\/ \|\s*[A-Z_, ]+\s*\|\s*([A-Z_, ]+?)\s*\|/.exec(line);
    if (row === null || row[1] === "reason") continue;
    for (const reason of row[1]!.split(",")) found.add(reason.trim());
  }
  return found;
}

describe.each([
  ["sessions/v1/session_service.proto", SESSIONS_REASONS],
  ["locks/v1/lock_service.proto", LOCKS_REASONS],
  ["budget/v1/budget_service.proto", BUDGET_REASONS],
])("%s", (proto, table) => {
  const documented = documentedReasons(proto);

  it("documents every reason the service's table holds", () => {
    const undocumented = Object.values(table).filter((reason) => !documented.has(reason));
    expect(undocumented).toEqual([]);
  });

  it("has in its table every reason it documents", () => {
    const values = new Set<string>(Object.values(table));
    expect([...documented].filter((reason) => !values.has(reason))).toEqual([]);
  });
});

describe("the tables", () => {
  it("name each reason by itself, so a key and what is sent cannot differ", () => {
    for (const table of [ANY_CALL_REASONS, SESSIONS_REASONS, LOCKS_REASONS, BUDGET_REASONS]) {
      for (const [key, value] of Object.entries(table)) expect(value).toBe(key);
    }
  });
});
