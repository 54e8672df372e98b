import { describe, expect, it } from "vitest";
import { createIdentityCache } from "./identity-cache.js";

describe("createIdentityCache", () => {
  it("derives once per object, by identity, not by content", () => {
    let calls = 0;
    const cache = createIdentityCache((key: { n: number }) => ({ doubled: key.n * 2, call: ++calls }));
    const a = { n: 1 };
    const first = cache.get(a);
    expect(cache.get(a)).toBe(first);
    expect(first).toEqual({ doubled: 2, call: 1 });
    // An equal but new object is a new domain state: derived again.
    expect(cache.get({ n: 1 })).toEqual({ doubled: 2, call: 2 });
    expect(calls).toBe(2);
  });
});
