import { describe, expect, it } from "vitest";
import { BerthError } from "./errors.js";
import { checkPathInput, checkRequestId, checkSessionId, isSessionId, REQUEST_ID_RULE, SESSION_ID_RULE } from "./safe-id.js";

describe("checkSessionId", () => {
  it.each(["a", "abc-DEF_123", "x".repeat(128), "-", "_"])("accepts %j", (id) => {
    expect(checkSessionId(id)).toBe(id);
    expect(isSessionId(id)).toBe(true);
  });

  it.each(["", "..", ".", "a/b", "a\\b", "a\0b", "a b", "é", "x".repeat(129), "a.b", "../etc"])("refuses %j", (id) => {
    expect(isSessionId(id)).toBe(false);
    let thrown: unknown;
    try {
      checkSessionId(id);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(BerthError);
    expect((thrown as BerthError).code).toBe("invalid_argument");
    expect((thrown as BerthError).message).toMatch(/^session_id: /);
    expect((thrown as BerthError).message).toContain(SESSION_ID_RULE);
  });

  it("names the field it was given", () => {
    expect(() => checkSessionId("a/b", "parent_id")).toThrow(/^parent_id: /);
  });

  it("refuses a non-string", () => {
    expect(() => checkSessionId(42)).toThrow(/^session_id: /);
  });
});

describe("checkPathInput", () => {
  it("accepts an ordinary path", () => {
    expect(checkPathInput("/repo/src/a b.ts", "file")).toBe("/repo/src/a b.ts");
    const longest = `${"x".repeat(255)}/`.repeat(16);
    expect(checkPathInput(longest, "file")).toHaveLength(4096);
  });

  it.each([
    ["", /file: is required/],
    ["a\0b", /file: must not contain a NUL/],
    ["x".repeat(4097), /file: must be at most 4096 bytes/],
    ["é".repeat(2049), /file: must be at most 4096 bytes, got 4098/],
    [`src/${"x".repeat(256)}.ts`, /file: must have names of at most 255 bytes between slashes, got one of 259/],
    [`src/${"é".repeat(128)}`, /file: must have names of at most 255 bytes between slashes, got one of 256/],
  ])("refuses %#", (input, message) => {
    expect(() => checkPathInput(input, "file")).toThrow(message);
  });
});

describe("checkRequestId", () => {
  it("takes an empty id as none", () => {
    expect(checkRequestId("")).toBeUndefined();
    expect(checkRequestId(undefined)).toBeUndefined();
  });

  it.each(["a", "0b6f3c1e-8a4d-4c2b-9f1e-2d3c4b5a6f70", "run.42_x-Y", "x".repeat(128)])("accepts %j", (id) => {
    expect(checkRequestId(id)).toBe(id);
  });

  it.each(["a b", "a/b", "é", "x".repeat(129), "a\0b", 42])("refuses %j naming the field and the rule", (id) => {
    let thrown: unknown;
    try {
      checkRequestId(id, "request_id");
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(BerthError);
    expect((thrown as BerthError).code).toBe("invalid_argument");
    expect((thrown as BerthError).message).toMatch(/^request_id: must match /);
    expect((thrown as BerthError).message).toContain(REQUEST_ID_RULE);
  });
});
