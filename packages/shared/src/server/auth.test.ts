import { describe, expect, it } from "vitest";
import { bearerTokenMatches, createTokenCheck } from "./auth.js";

describe("bearerTokenMatches", () => {
  it("accepts only `Bearer <token>`, scheme case-insensitive", () => {
    expect(bearerTokenMatches("Bearer abc", "abc")).toBe(true);
    expect(bearerTokenMatches("bearer   abc ", "abc")).toBe(true);
    expect(bearerTokenMatches("Bearer abcd", "abc")).toBe(false);
    expect(bearerTokenMatches("Bearer ab", "abc")).toBe(false);
    expect(bearerTokenMatches("Basic abc", "abc")).toBe(false);
    expect(bearerTokenMatches("abc", "abc")).toBe(false);
    expect(bearerTokenMatches(null, "abc")).toBe(false);
  });
});

describe("createTokenCheck", () => {
  it("passes the token and refuses UNAUTHENTICATED, TOKEN_MISSING without a header and TOKEN_INVALID with a wrong one", () => {
    const check = createTokenCheck("t0ken");
    expect(check("Bearer t0ken")).toBeUndefined();
    expect(check(null)).toMatchObject({ code: "unauthenticated", reason: "TOKEN_MISSING" });
    expect(check("Bearer nope")).toMatchObject({ code: "unauthenticated", reason: "TOKEN_INVALID" });
    expect(check("t0ken")).toMatchObject({ code: "unauthenticated", reason: "TOKEN_INVALID" });
  });

  it("refuses an empty token at construction", () => {
    expect(() => createTokenCheck("")).toThrow(/empty/);
  });
});
