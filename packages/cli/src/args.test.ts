import { describe, expect, it } from "vitest";
import { closest, parseFlags, UsageError, wantsHelp } from "./args.js";

const FLAGS = { json: { type: "boolean" }, "from-seq": { type: "string" }, help: { type: "boolean", short: "h" } } as const;

function usage(args: string[], allowPositionals = true): string {
  try {
    parseFlags(args, FLAGS, allowPositionals);
  } catch (error) {
    expect(error).toBeInstanceOf(UsageError);
    return (error as Error).message;
  }
  throw new Error(`${args.join(" ")} parsed`);
}

describe("parseFlags", () => {
  it("parses flags and positionals", () => {
    expect(parseFlags(["s1", "--json", "--from-seq", "3"], FLAGS, true)).toEqual({ values: { json: true, "from-seq": "3" }, positionals: ["s1"] });
  });

  it("names an unknown flag, with the nearest known one when it is near", () => {
    expect(usage(["--jsn"])).toBe("unknown flag '--jsn' (did you mean --json?)");
    expect(usage(["--from"])).toBe("unknown flag '--from' (did you mean --from-seq?)");
    expect(usage(["--bogus"])).toBe("unknown flag '--bogus'");
    expect(usage(["-x"])).toBe("unknown flag '-x'");
  });

  it("says which flag lacks a value, takes none, or needs --flag=VALUE", () => {
    expect(usage(["--from-seq"])).toBe("--from-seq needs a value");
    expect(usage(["--json=yes"])).toBe("--json takes no value");
    expect(usage(["--from-seq", "-1"])).toBe("--from-seq: a value that starts with '-' must be given as --from-seq=VALUE");
  });

  it("names an unexpected argument", () => {
    expect(usage(["extra"], false)).toBe("unexpected argument 'extra'");
  });
});

describe("closest", () => {
  it("finds typos and prefixes, not far-fetched names", () => {
    expect(closest("sesions", ["up", "sessions", "lock"])).toBe("sessions");
    expect(closest("stat", ["state", "check"])).toBe("state");
    expect(closest("frobnicate", ["sessions", "lock"])).toBeUndefined();
    expect(closest("-x", ["-h"])).toBeUndefined();
    expect(closest("", ["a"])).toBeUndefined();
  });
});

describe("wantsHelp", () => {
  it("sees --help and -h before --, never after (they are CMD's)", () => {
    expect(wantsHelp(["hold", "f", "--help"])).toBe(true);
    expect(wantsHelp(["-h"])).toBe(true);
    expect(wantsHelp(["hold", "f", "--", "cmd", "--help"])).toBe(false);
  });
});
