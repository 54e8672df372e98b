import * as os from "node:os";
import { describe, expect, it } from "vitest";
import { lazyBuiltin } from "./lazy-builtin.js";

describe("lazyBuiltin", () => {
  it("reads as the module itself: functions, constants, keys", () => {
    const lazy = lazyBuiltin<typeof os>("node:os");
    expect(lazy.platform()).toBe(os.platform());
    expect(lazy.constants.signals.SIGTERM).toBe(os.constants.signals.SIGTERM);
    expect("hostname" in lazy).toBe(true);
    expect(Object.keys(lazy).sort()).toEqual(
      Object.keys(os)
        .filter((k) => k !== "default")
        .sort(),
    );
  });

  it("loads the module only when a member is first read", () => {
    // A built-in nothing else here loads.
    // process.moduleLoadList: Node's own list of the built-ins loaded so far (not in @types/node).
    const loaded = () => (process as unknown as { moduleLoadList: string[] }).moduleLoadList.includes("NativeModule trace_events");
    expect(loaded()).toBe(false);
    const lazy = lazyBuiltin<typeof import("node:trace_events")>("node:trace_events");
    expect(loaded()).toBe(false);
    expect(typeof lazy.createTracing).toBe("function");
    expect(loaded()).toBe(true);
  });
});
