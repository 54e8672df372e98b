import { describe, expect, it } from "vitest";
import { isRequired, requiringVariable } from "./required-by-environment.js";

describe("isRequired", () => {
  it("is set by BERTH_REQUIRE_<NAME>=1 (or any value but empty, 0 and false)", () => {
    expect(requiringVariable("etcd")).toBe("BERTH_REQUIRE_ETCD");
    expect(isRequired("etcd", { BERTH_REQUIRE_ETCD: "1" })).toBe(true);
    expect(isRequired("go", { BERTH_REQUIRE_GO: "yes" })).toBe(true);
    for (const off of [undefined, "", "0", "false"]) expect(isRequired("python", { BERTH_REQUIRE_PYTHON: off })).toBe(false);
    expect(isRequired("python", { BERTH_REQUIRE_ETCD: "1" })).toBe(false);
  });
});
