import { describe, expect, it } from "vitest";
import { renderHelp, rows, wrap } from "./help.js";

describe("wrap", () => {
  it("wraps at 100 columns with the given indents and keeps short text as is", () => {
    expect(wrap("short text", "    ", "  ")).toBe("  short text");
    const long = Array.from({ length: 40 }, (_, i) => `word${i}`).join(" ");
    const lines = wrap(long, "    ").split("\n");
    expect(lines.length).toBeGreaterThan(1);
    for (const line of lines) expect(line.length).toBeLessThanOrEqual(100);
    expect(lines.every((line) => line.startsWith("    "))).toBe(true);
  });
});

describe("rows", () => {
  it("aligns the second column; a first column too wide puts its text on the next line", () => {
    expect(
      rows([
        ["--json", "JSON lines"],
        ["--from-seq N", "start at N"],
      ]),
    ).toBe("  --json        JSON lines\n  --from-seq N  start at N");
    const wide = rows([
      ["-a", "x"],
      ["--a-very-long-flag-name VALUE", "text"],
    ]);
    expect(wide).toBe("  -a  x\n  --a-very-long-flag-name VALUE\n      text");
  });
});

describe("renderHelp", () => {
  it("lays out usage, about, flags, notes, exit codes (in numeric order) and examples", () => {
    const help = renderHelp({
      usage: ["berth thing X", "berth thing Y"],
      about: "Does the thing.",
      flags: [["--json", "JSON lines"]],
      notes: "A note.",
      exitCodes: [
        ["69", "unreachable"],
        ["0", "done"],
        ["CMD's", "its own"],
        ["126/127", "cannot run"],
        ["2", "usage"],
      ],
      examples: ["berth thing X", "berth thing Y  # why"],
      footer: "More in docs/cli.md.",
    });
    expect(help).toBe(
      [
        "usage: berth thing X",
        "       berth thing Y",
        "",
        "Does the thing.",
        "",
        "Flags:",
        "  --json  JSON lines",
        "",
        "A note.",
        "",
        "Exit codes:",
        "  CMD's    its own",
        "  0        done",
        "  2        usage",
        "  69       unreachable",
        "  126/127  cannot run",
        "",
        "Examples:",
        "  berth thing X",
        "  berth thing Y  # why",
        "",
        "More in docs/cli.md.",
      ].join("\n"),
    );
  });
});
