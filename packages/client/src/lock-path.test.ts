import { describe, expect, it } from "vitest";
import { absoluteLockPath } from "./lock-path.js";

describe("absoluteLockPath", () => {
  it("joins a relative path to the working directory without normalising it (the service takes '..' as the kernel does)", () => {
    expect(absoluteLockPath("src/app.css", "/home/me/proj")).toBe("/home/me/proj/src/app.css");
    expect(absoluteLockPath("../proj/src/x/../app.css", "/home/me/other")).toBe("/home/me/other/../proj/src/x/../app.css");
    expect(absoluteLockPath("./a", "/")).toBe("/./a");
  });

  it("leaves an absolute path as given, and uses this process's directory by default", () => {
    expect(absoluteLockPath("/srv/link/a.css", "/elsewhere")).toBe("/srv/link/a.css");
    expect(absoluteLockPath("a.css")).toBe(`${process.cwd()}/a.css`);
  });
});
