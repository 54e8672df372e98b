/**
 * What every backend of the election seam promises, run against each: the file backend and the
 * in-memory double (a second backend adds itself to the list).
 */
import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { fileElector } from "./election.js";
import { ElectionHeldError, type Elector } from "./elector.js";
import { createMemoryElector } from "./testing/memory-elector.js";

const backends: Array<[string, () => Elector]> = [
  ["the file backend", () => fileElector],
  ["the in-memory double", createMemoryElector],
];

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) fs.rmSync(dir, { recursive: true, force: true });
});
function scope(): string {
  const dir = fs.mkdtempSync(path.join(tmpdir(), "berth-elector-"));
  dirs.push(dir);
  return dir;
}

describe.each(backends)("the election seam: %s", (_name, make) => {
  it("has one holder per scope and name; a release lets the next one in", async () => {
    const elector = make();
    const dir = scope();
    const first = await elector.acquire(dir, "svc", { service: "sessions" });
    expect(first.claim).toMatchObject({ pid: process.pid, service: "sessions" });
    const refused = await elector.acquire(dir, "svc").then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(refused).toBeInstanceOf(ElectionHeldError);
    expect((refused as ElectionHeldError).holder).toMatchObject({ pid: process.pid, service: "sessions" });
    expect((refused as ElectionHeldError).message).toMatch(new RegExp(`^${dir} is already served by pid ${process.pid} \\(sessions,`));
    // Another name, or another scope, is another election.
    const other = await elector.acquire(dir, "other");
    const elsewhere = await elector.acquire(scope(), "svc");
    first.release();
    first.release();
    const second = await elector.acquire(dir, "svc");
    expect(second.claim.service).toBe("svc");
    for (const lock of [second, other, elsewhere]) lock.release();
  });
});
