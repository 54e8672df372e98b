import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { Headers as LightHeaders } from "./headers.js";

type Op = ["append" | "set", string, string] | ["delete", string];

// A few names in several spellings (the class folds case), set-cookie (kept apart), and values
// with the whitespace the standard trims.
const name = fc.constantFrom("content-type", "Content-Type", "grpc-status", "X-Trace", "x-trace", "set-cookie", "Set-Cookie", "a");
const value = fc.constantFrom("", "1", " padded\t", "a, b", "Bearer x", "v=1; Path=/");
const op: fc.Arbitrary<Op> = fc.oneof(
  fc.tuple(fc.constantFrom("append" as const, "set" as const), name, value),
  fc.tuple(fc.constant("delete" as const), name),
);

interface HeadersLike {
  append(name: string, value: string): void;
  set(name: string, value: string): void;
  delete(name: string): void;
  get(name: string): string | null;
  has(name: string): boolean;
  getSetCookie(): string[];
  forEach(f: (value: string, name: string) => void): void;
  [Symbol.iterator](): Iterator<[string, string]>;
}

function observe(headers: HeadersLike) {
  const names = ["content-type", "GRPC-STATUS", "x-trace", "set-cookie", "a", "absent"];
  const each: [string, string][] = [];
  headers.forEach((v, k) => each.push([k, v]));
  return {
    entries: [...headers],
    each,
    get: names.map((n) => headers.get(n)),
    has: names.map((n) => headers.has(n)),
    cookies: headers.getSetCookie(),
  };
}

function apply(headers: HeadersLike, ops: readonly Op[]): void {
  for (const o of ops) {
    if (o[0] === "delete") headers.delete(o[1]);
    else headers[o[0]](o[1], o[2]);
  }
}

describe("the command's Headers", () => {
  it("answers as Node's own after any appends, sets and deletes", () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 12 }), (ops) => {
        const light = new LightHeaders();
        const node = new globalThis.Headers();
        apply(light, ops);
        apply(node, ops);
        expect(observe(light)).toEqual(observe(node));
        // Copies, from each kind of init, read the same.
        const pairs = [...node];
        expect(observe(new LightHeaders(light))).toEqual(observe(new globalThis.Headers(node)));
        expect(observe(new LightHeaders(pairs))).toEqual(observe(new globalThis.Headers(pairs)));
        const record = Object.fromEntries(pairs);
        expect(observe(new LightHeaders(record))).toEqual(observe(new globalThis.Headers(record)));
      }),
    );
  });

  it("refuses what Node's refuses: a name that is not a token, a value with a line break", () => {
    for (const [n, v] of [
      ["bad name", "x"],
      ["", "x"],
      ["x", "a\nb"],
      ["x", "a\rb"],
      ["x", "a\0b"],
    ] as const) {
      expect(() => new globalThis.Headers().append(n, v)).toThrow(TypeError);
      expect(() => new LightHeaders().append(n, v)).toThrow(TypeError);
      expect(() => new LightHeaders().set(n, v)).toThrow(TypeError);
    }
    expect(() => new LightHeaders([["a", "b", "c"]] as unknown as [string, string][])).toThrow(TypeError);
  });
});
