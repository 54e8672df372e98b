import { describe, expect, it } from "vitest";
import { parseOrigin, parseOrigins } from "./origins.js";

describe("parseOrigin", () => {
  it("takes an origin as a browser sends it, in its canonical form", () => {
    expect(parseOrigin("http://localhost:3000", "cors-origin")).toBe("http://localhost:3000");
    expect(parseOrigin(" HTTP://LocalHost:3000/ ", "cors-origin")).toBe("http://localhost:3000");
    expect(parseOrigin("https://tools.example.com:443", "cors-origin")).toBe("https://tools.example.com");
    expect(parseOrigin("http://[::1]:8080", "cors-origin")).toBe("http://[::1]:8080");
  });

  it("refuses *, other schemes, paths, credentials and non-URLs, naming the field", () => {
    expect(() => parseOrigin("*", "--cors-origin")).toThrow(/--cors-origin.*must name each origin.*any site/);
    expect(() => parseOrigin("localhost:3000", "--cors-origin")).toThrow(/--cors-origin.*http or https/);
    expect(() => parseOrigin("file:///tmp/page.html", "--cors-origin")).toThrow(/http or https origin/);
    expect(() => parseOrigin("http://localhost:3000/app", "BERTH_CORS_ORIGINS")).toThrow(/BERTH_CORS_ORIGINS.*origin alone/);
    expect(() => parseOrigin("http://user:pw@localhost:3000", "--cors-origin")).toThrow(/origin alone/);
    expect(() => parseOrigin("http://localhost:3000?x=1", "--cors-origin")).toThrow(/origin alone/);
    expect(() => parseOrigin("not an origin", "--cors-origin")).toThrow(/must be an origin such as/);
  });
});

describe("parseOrigins", () => {
  it("takes a comma-separated list, each canonical, once", () => {
    expect(parseOrigins("http://localhost:3000, http://127.0.0.1:5173,http://LOCALHOST:3000", "--cors-origin")).toEqual([
      "http://localhost:3000",
      "http://127.0.0.1:5173",
    ]);
  });

  it("refuses an empty list and any bad member", () => {
    expect(() => parseOrigins(" , ", "--cors-origin")).toThrow(/at least one origin/);
    expect(() => parseOrigins("http://localhost:3000,*", "--cors-origin")).toThrow(/must name each origin/);
  });
});
