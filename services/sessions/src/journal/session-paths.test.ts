import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { checkSessionId } from "@berth/shared/safe-id";
import { journalPath, resolveSessionDirs, sessionIdFromFileName, snapshotPath } from "./session-paths.js";

describe("session paths", () => {
  it("are the seed's file names, for checked ids only", () => {
    expect(journalPath("/state/sessions", checkSessionId("abc_1-2"))).toBe("/state/sessions/abc_1-2.jsonl");
    expect(snapshotPath("/state/sessions", checkSessionId("abc"))).toBe("/state/sessions/abc.snapshot.json");
    // A path takes a SessionId: the ids that could escape the directory never pass the check that makes one.
    for (const bad of ["", "..", "a/b", "a.b", "a\0b", "x".repeat(129)]) expect(() => journalPath("/d", checkSessionId(bad))).toThrow(/session_id/);
  });

  it("resolve berth's own state dir and a project's live dir with its legacy root", () => {
    expect(resolveSessionDirs({ stateDir: "/var/lib/berth" })).toEqual({ dir: "/var/lib/berth/sessions" });
    expect(resolveSessionDirs({ liveDir: "/home/me/app/.impeccable/live" })).toEqual({
      dir: "/home/me/app/.impeccable/live/sessions",
      legacyDir: "/home/me/app/.impeccable-live/sessions",
    });
    expect(resolveSessionDirs({}).dir).toBe(path.resolve(".berth/sessions"));
  });

  it("name sessions from journal file names", () => {
    expect(sessionIdFromFileName("s1.jsonl")).toBe("s1");
    expect(sessionIdFromFileName("s1.snapshot.json")).toBeUndefined();
    expect(sessionIdFromFileName(".s1.jsonl.123.migrate")).toBeUndefined();
    expect(sessionIdFromFileName("a.b.jsonl")).toBeUndefined();
  });
});
