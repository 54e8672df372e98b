import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { isBerthError } from "@berth/shared/errors";
import { checkJournalEnd, checkOwnWrite, ForeignAppendError } from "./journal-guard.js";
import { childScripts, spawnChild, type Child, type ChildScripts } from "../locks/testing/child-scripts.js";
import { createSessionStore } from "../create-session-store.js";
import { loadSeedStore, seedsAvailable, type SeedStoreHarness } from "../testing/seed-store.js";
import { seedDirsOf } from "../testing/seed-writer.js";

let dir: string;
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-guard-"));
});
afterEach(() => {
  fs.rmSync(dir, { recursive: true, force: true });
});

/** Opens `file` as the store does for appending. */
function appendFd(file: string): number {
  return fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT, 0o600);
}

function foreignError(run: () => void): ForeignAppendError {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(ForeignAppendError);
    return error as ForeignAppendError;
  }
  throw new Error("expected a ForeignAppendError");
}

describe("the checks around a write of berth's", () => {
  it("before: the journal must end where berth's last byte is", () => {
    const file = path.join(dir, "j.jsonl");
    fs.writeFileSync(file, "a\n");
    const fd = appendFd(file);
    try {
      checkJournalEnd(fd, 2);
      fs.appendFileSync(file, "theirs\n");
      expect(foreignError(() => checkJournalEnd(fd, 2))).toMatchObject({ expected: 2, found: 9, outcome: "unwritten" });
    } finally {
      fs.closeSync(fd);
    }
  });

  it("after: berth's bytes alone, or first with other lines behind them, pass", () => {
    const file = path.join(dir, "j.jsonl");
    fs.writeFileSync(file, "a\n");
    const fd = appendFd(file);
    try {
      const ours = Buffer.from("ours 1\nours 2\n");
      fs.writeSync(fd, ours);
      checkOwnWrite(fd, file, 2, ours);
      const again = Buffer.from("ours 3\n");
      fs.writeSync(fd, again);
      fs.appendFileSync(file, "theirs, later\n");
      checkOwnWrite(fd, file, 2 + ours.length, again);
      expect(fs.readFileSync(file, "utf8")).toBe("a\nours 1\nours 2\nours 3\ntheirs, later\n");
    } finally {
      fs.closeSync(fd);
    }
  });

  it("after: berth's bytes behind another writer's line are blanked in place, and nothing of the other writer's is touched", () => {
    const file = path.join(dir, "j.jsonl");
    fs.writeFileSync(file, "a\n");
    const fd = appendFd(file);
    try {
      fs.appendFileSync(file, "theirs first\n");
      const ours = Buffer.from("ours 1\nours 2\n");
      fs.writeSync(fd, ours);
      fs.appendFileSync(file, "theirs after\n");
      expect(foreignError(() => checkOwnWrite(fd, file, 2, ours))).toMatchObject({ expected: 2, found: 15, outcome: "blanked" });
      expect(fs.readFileSync(file, "utf8")).toBe(`a\ntheirs first\n${" ".repeat(6)}\n${" ".repeat(6)}\ntheirs after\n`);
    } finally {
      fs.closeSync(fd);
    }
  });
});

describe("bytes of berth's that cannot be found whole", () => {
  it("are left as they are, never cut, and said so", () => {
    const file = path.join(dir, "j.jsonl");
    fs.writeFileSync(file, "a\n");
    const fd = appendFd(file);
    try {
      // As if a short write's two pieces had another writer's line between them.
      fs.writeSync(fd, "our");
      fs.appendFileSync(file, "theirs\n");
      fs.writeSync(fd, "s\n");
      expect(foreignError(() => checkOwnWrite(fd, file, 2, Buffer.from("ours\n")))).toMatchObject({ outcome: "left" });
      expect(fs.readFileSync(file, "utf8")).toBe("a\nourtheirs\ns\n");
    } finally {
      fs.closeSync(fd);
    }
  });
});

/**
 * Berth appending back to back while another process appends to the same session every 2 ms, as a
 * seed process sharing a live directory does (25 appends a run), `RUNS` times (BERTH_SEED_RACE_RUNS; 20 by default).
 * Counted in the journal, in file order: lines of berth's whose seq a line before them already
 * had (berth overtaken: must be none), and lines of the other process's whose seq a line of
 * berth's before them already had (the other process read the journal before berth's line landed
 * and wrote after it: the seed's own read-then-write, which no check of berth's can see; counted,
 * not judged). Every append berth acknowledged is in the journal exactly once, under the seq it
 * was acknowledged with; a refused one (UNAVAILABLE APPEND_OVERTAKEN, retried) never.
 */
describe("berth and a process appending in the seed's way, at once", () => {
  const RUNS = Number(process.env.BERTH_SEED_RACE_RUNS ?? 20);
  const SEED_APPENDS = 25;
  const BERTH_CLIENTS = 2;
  const TIMEOUT_MS = 60_000 + RUNS * 10_000;
  let scripts: ChildScripts;
  beforeAll(() => {
    scripts = childScripts();
  });
  afterAll(() => scripts.dispose());

  interface Tally {
    runs: number;
    berthAppends: number;
    refused: number;
    seedLines: number;
    berthOvertaken: number;
    seedRepeated: number;
    missingOrRepeated: string[];
  }

  async function race(writer: "stand-in" | SeedStoreHarness): Promise<Tally> {
    const live = writer === "stand-in" ? seedDirsOf(path.join(dir, "project")) : { dir: writer.sessionsDir };
    fs.mkdirSync(live.dir, { recursive: true });
    const script = await scripts.script(path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "testing", "seed-writer-child.ts"));
    const child: Child = spawnChild(script, {
      dir: live.dir,
      appends: SEED_APPENDS,
      intervalMs: 2,
      ...(writer === "stand-in" ? {} : { seedStore: { module: writer.moduleUrl, project: writer.project } }),
    });
    const store = createSessionStore({ dir: live.dir, fsync: "batch" });
    const tally: Tally = { runs: 0, berthAppends: 0, refused: 0, seedLines: 0, berthOvertaken: 0, seedRepeated: 0, missingOrRepeated: [] };
    try {
      await child.next("ready");
      for (let run = 0; run < RUNS; run++) {
        const id = `race-${run}`;
        await store.append(id, [{ type: "generate", count: 1 }]);
        const acknowledged = new Map<number, number>();
        let next = 0;
        let seedDone = false;
        child.send(`go ${id}`);
        const done = child.next("done", 60_000).then((event) => {
          seedDone = true;
          return event;
        });
        await Promise.all(
          Array.from({ length: BERTH_CLIENTS }, async () => {
            while (!seedDone) {
              const revision = next++;
              for (;;) {
                try {
                  const result = await store.append(id, [{ type: "checkpoint", owner: "berth", revision }]);
                  acknowledged.set(revision, result.firstSeq);
                  break;
                } catch (error) {
                  if (!isBerthError(error) || error.reason !== "APPEND_OVERTAKEN") throw error;
                  tally.refused++;
                }
              }
            }
          }),
        );
        await done;
        tally.runs++;
        tally.berthAppends += acknowledged.size;
        const found = new Map<number, number[]>();
        let maxSeq = 0;
        let lastBerthSeq = 0;
        for (const line of fs.readFileSync(path.join(live.dir, `${id}.jsonl`), "utf8").split("\n")) {
          if (line.trim() === "") continue;
          const entry = JSON.parse(line) as { seq: number; crc?: string; event: { revision?: number } };
          if (entry.crc !== undefined) {
            if (entry.seq <= maxSeq) tally.berthOvertaken++;
            lastBerthSeq = Math.max(lastBerthSeq, entry.seq);
            const revision = entry.event.revision;
            if (revision !== undefined) found.set(revision, [...(found.get(revision) ?? []), entry.seq]);
          } else {
            tally.seedLines++;
            if (entry.seq <= lastBerthSeq) tally.seedRepeated++;
          }
          maxSeq = Math.max(maxSeq, entry.seq);
        }
        for (const [revision, seq] of acknowledged) {
          const seqs = found.get(revision) ?? [];
          if (seqs.length !== 1 || seqs[0] !== seq)
            tally.missingOrRepeated.push(`${id} revision ${revision}: acknowledged as seq ${seq}, in the journal as ${JSON.stringify(seqs)}`);
        }
        for (const revision of found.keys())
          if (!acknowledged.has(revision)) tally.missingOrRepeated.push(`${id} revision ${revision}: never acknowledged, yet in the journal`);
      }
      child.send("exit");
      await child.exited;
      return tally;
    } finally {
      await store.close();
      child.process.kill("SIGKILL");
    }
  }

  it(
    `no line of berth's repeats a seq, and the journal holds exactly what was acknowledged (${RUNS} runs; the other process's repeats counted)`,
    async () => {
      const tally = await race("stand-in");
      console.log(
        JSON.stringify({
          measure: "berth beside a seed-format writer appending every 2 ms",
          writer: "stand-in",
          ...tally,
          missingOrRepeated: tally.missingOrRepeated.length,
        }),
      );
      expect(tally.runs).toBe(RUNS);
      expect(tally.seedLines).toBe(RUNS * SEED_APPENDS);
      expect(tally.berthOvertaken).toBe(0);
      expect(tally.missingOrRepeated).toEqual([]);
    },
    TIMEOUT_MS,
  );

  it.skipIf(!seedsAvailable())(
    `the same beside the seed's own store (${RUNS} runs)`,
    async () => {
      const seed = await loadSeedStore();
      try {
        const tally = await race(seed);
        console.log(
          JSON.stringify({
            measure: "berth beside a seed-format writer appending every 2 ms",
            writer: "the seed's store",
            ...tally,
            missingOrRepeated: tally.missingOrRepeated.length,
          }),
        );
        expect(tally.seedLines).toBe(RUNS * SEED_APPENDS);
        expect(tally.berthOvertaken).toBe(0);
        expect(tally.missingOrRepeated).toEqual([]);
      } finally {
        seed.remove();
      }
    },
    TIMEOUT_MS,
  );
});
