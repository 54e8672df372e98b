import { describe, expect, it } from "vitest";
import { LiveLine, isTerminal, styleFor } from "./terminal.js";

function stream(isTTY: boolean, columns = 0) {
  const written: string[] = [];
  return { isTTY, columns, written, write: (text: string) => written.push(text) };
}

describe("styleFor", () => {
  it("colours a terminal only, and never with NO_COLOR or TERM=dumb", () => {
    expect(styleFor(stream(true), { TERM: "xterm" }).bold("x")).toBe("\x1b[1mx\x1b[22m");
    expect(styleFor(stream(true), { TERM: "xterm" }).red("x")).toBe("\x1b[31mx\x1b[39m");
    expect(styleFor(stream(false), { TERM: "xterm" }).bold("x")).toBe("x");
    expect(styleFor(stream(true), { TERM: "xterm", NO_COLOR: "1" }).bold("x")).toBe("x");
    expect(styleFor(stream(true), { TERM: "dumb" }).bold("x")).toBe("x");
    // NO_COLOR set but empty does not count (no-color.org).
    expect(styleFor(stream(true), { TERM: "xterm", NO_COLOR: "" }).enabled).toBe(true);
  });

  it("isTerminal: a TTY that is not TERM=dumb", () => {
    expect(isTerminal(stream(true), {})).toBe(true);
    expect(isTerminal(stream(true), { TERM: "dumb" })).toBe(false);
    expect(isTerminal(stream(false), {})).toBe(false);
  });
});

describe("LiveLine", () => {
  it("rewrites the line in place, cut to the terminal's width, and erases it", () => {
    const out = stream(true, 30);
    const line = new LiveLine(out);
    line.clear();
    expect(out.written).toEqual([]);
    line.show("short");
    line.show("a line much longer than thirty columns");
    line.clear();
    expect(out.written).toEqual(["\r\x1b[Kshort", "\r\x1b[Ka line much longer than thir…", "\r\x1b[K"]);
  });

  it("takes a generous width when the terminal does not say", () => {
    const out = stream(true, 0);
    new LiveLine(out).show("x".repeat(200));
    expect(out.written[0]!.length).toBe("\r\x1b[K".length + 159);
  });
});
