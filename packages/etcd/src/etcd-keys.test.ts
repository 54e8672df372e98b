import { describe, expect, it } from "vitest";
import { createKeySpace, rangeEndOfPrefix } from "./etcd-keys.js";

describe("rangeEndOfPrefix", () => {
  it("is the prefix with its last byte below 0xff incremented, what follows dropped", () => {
    expect([...rangeEndOfPrefix(new Uint8Array([0x61, 0x62]))]).toEqual([0x61, 0x63]);
    expect([...rangeEndOfPrefix(new Uint8Array([0x61, 0xff, 0xff]))]).toEqual([0x62]);
  });

  it("is etcd's \\0 (to the end) when no byte can be incremented", () => {
    expect([...rangeEndOfPrefix(new Uint8Array([0xff]))]).toEqual([0]);
    expect([...rangeEndOfPrefix(new Uint8Array([]))]).toEqual([0]);
  });
});

describe("createKeySpace", () => {
  const keys = createKeySpace("berth/");

  it("puts keys under the prefix and takes them back out", () => {
    expect(Buffer.from(keys.encode("s/é")).toString("utf8")).toBe("berth/s/é");
    expect(keys.decode(keys.encode("s/é"))).toBe("s/é");
    expect(Buffer.from(keys.prefixEnd("s/")).toString("utf8")).toBe("berth/s0");
  });

  it("refuses a key outside the prefix", () => {
    expect(() => keys.decode(new TextEncoder().encode("other/x"))).toThrow(/outside berth's prefix/);
  });
});
