import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import {
  descriptorLimit,
  descriptorShares,
  descriptorShortageIn,
  isDescriptorExhaustion,
  onDescriptorShortage,
  relieveDescriptorShortage,
  retryAfterRelief,
} from "./descriptors.js";

describe("the descriptor limit", () => {
  it("is the soft RLIMIT_NOFILE of /proc/self/limits", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-limits-"));
    try {
      fs.writeFileSync(
        path.join(dir, "limits"),
        "Limit                     Soft Limit           Hard Limit           Units\nMax open files            256                  4096                 files\n",
      );
      fs.writeFileSync(path.join(dir, "unlimited"), "Max open files            unlimited            unlimited            files\n");
      expect(descriptorLimit(path.join(dir, "limits"))).toBe(256);
      expect(descriptorLimit(path.join(dir, "unlimited"))).toBeUndefined();
      expect(descriptorLimit(path.join(dir, "missing"))).toBeUndefined();
    } finally {
      fs.rmSync(dir, { recursive: true });
    }
    expect(descriptorLimit()).toBeGreaterThan(0);
  });
});

describe("the shares of the limit", () => {
  it("gives connections three quarters, a few spare ones, and journals half of what the process does not need", () => {
    expect(descriptorShares(256)).toEqual({ limit: 256, connections: 192, spareConnections: 5, journals: 13 });
    expect(descriptorShares(1024)).toEqual({ limit: 1024, connections: 768, spareConnections: 20, journals: 102 });
    expect(descriptorShares(4096)).toEqual({ limit: 4096, connections: 3072, spareConnections: 32, journals: 480 });
    expect(descriptorShares(65_536)).toEqual({ limit: 65_536, connections: 49_152, spareConnections: 32, journals: 8160 });
  });

  it("leaves everything within the limit, and keeps a few journals however low it is", () => {
    for (const limit of [64, 128, 256, 512, 1024, 4096, 1 << 20]) {
      const shares = descriptorShares(limit);
      expect(shares.connections + shares.spareConnections + shares.journals, `at ${limit}`).toBeLessThanOrEqual(limit);
    }
    expect(descriptorShares(64).journals).toBe(4);
  });

  it("bounds nothing when the limit is unknown", () => {
    expect(descriptorShares(undefined)).toMatchObject({ connections: Infinity, journals: Infinity });
  });
});

describe("a shortage", () => {
  it("is EMFILE or ENFILE", () => {
    const error = (code: string) => Object.assign(new Error(code), { code });
    expect(isDescriptorExhaustion(error("EMFILE"))).toBe(true);
    expect(isDescriptorExhaustion(error("ENFILE"))).toBe(true);
    expect(isDescriptorExhaustion(error("ENOSPC"))).toBe(false);
    expect(isDescriptorExhaustion(new Error("EMFILE"))).toBe(false);
  });

  it("is found as the cause of another error (a client library's wrapping)", () => {
    const emfile = Object.assign(new Error("connect EMFILE"), { code: "EMFILE" });
    expect(descriptorShortageIn(emfile)).toBe(emfile);
    expect(descriptorShortageIn(new Error("wrapped", { cause: new Error("again", { cause: emfile }) }))).toBe(emfile);
    expect(descriptorShortageIn(new Error("wrapped", { cause: Object.assign(new Error("reset"), { code: "ECONNRESET" }) }))).toBeUndefined();
    expect(descriptorShortageIn("EMFILE")).toBeUndefined();
  });

  it("asks every registered holder to close its idle descriptors, until it unregisters", () => {
    let asked = 0;
    const unregister = onDescriptorShortage(() => {
      asked++;
      return 3;
    });
    const other = onDescriptorShortage(() => 2);
    expect(relieveDescriptorShortage()).toBe(5);
    unregister();
    expect(relieveDescriptorShortage()).toBe(2);
    other();
    expect(relieveDescriptorShortage()).toBe(0);
    expect(asked).toBe(1);
  });

  it("is met by a retry once the idle descriptors are closed; another error is not retried", () => {
    let free = 0;
    const unregister = onDescriptorShortage(() => {
      free = 1;
      return 1;
    });
    try {
      const open = () => {
        if (free === 0) throw Object.assign(new Error("EMFILE: too many open files"), { code: "EMFILE" });
        return "opened";
      };
      expect(retryAfterRelief(open)).toBe("opened");
      free = 0;
      let calls = 0;
      const broken = () => {
        calls++;
        throw Object.assign(new Error("ENOSPC"), { code: "ENOSPC" });
      };
      expect(() => retryAfterRelief(broken)).toThrow("ENOSPC");
      expect(calls).toBe(1);
      expect(free).toBe(0);
    } finally {
      unregister();
    }
  });
});
