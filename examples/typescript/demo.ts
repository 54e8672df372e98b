/**
 * berth from TypeScript, the whole tour: append events to a session's journal, watch it (the
 * backlog, the caught-up marker, a live entry), see a typed error, hold a source lock for a block
 * and write under its fence, and admit work through the budget.
 *
 *   node examples/typescript/dist/demo.js [SESSION]
 *
 * It finds the services as every berth client does (BERTH_SESSIONS_URL, …, else 127.0.0.1:7301
 * and :7302; the README's "Finding the services") and prints one line per step.
 */
import { Berth, BerthClientError, start } from "@berth/client";

const berth = new Berth();
const session = process.argv[2] ?? `ts-demo-${process.pid}`;

// 1. Append: a journal event as the journal holds it ({type, ...keys}).
const first = await berth.append(session, { type: "generate", pageUrl: "/pricing", count: 3 });
console.log(`appended seq ${first.seq} (phase ${first.snapshot?.phase})`);

// 2. Watch: the backlog, then caught-up, then live entries; leaving the loop ends the watch.
for await (const event of berth.watch(session, { includeSnapshot: true, timeoutMs: 30_000 })) {
  if (event.kind === "entry") {
    console.log(`${event.live ? "live" : "backlog"} entry #${event.entry.seq} ${event.entry.type}${event.snapshot ? ` (phase ${event.snapshot.phase})` : ""}`);
    if (event.live) break;
  } else if (event.kind === "caughtUp") {
    console.log(`caught up at seq ${event.lastSeq}`);
    // Something new, to see it arrive live.
    await berth.append(session, { type: "steer", pageUrl: "/pricing" });
  }
}

// 3. A typed error: an append that expects a seq the session has moved past.
try {
  await berth.append(session, { type: "steer" }, { expectedSeq: 1 });
} catch (error) {
  if (!(error instanceof BerthClientError) || error.seqConflict === undefined) throw error;
  console.log(`refused: ${error.reason}, the last seq is ${error.seqConflict.currentSeq}`);
}

// 4. A source lock, held for the block (a relative path is this directory's): `await using`
// releases it when the block ends, whatever ends it; a write under its fence is refused once lost.
{
  await using lease = await berth.lock("src/app.css", { owner: "typescript demo", maxWaitMs: 30_000 });
  console.log(`holding ${lease.file}, fencing token ${lease.fencingToken}`);
  const fenced = await berth.append(session, { type: "steer" }, { fence: { file: lease.file, fencingToken: lease.fencingToken } });
  console.log(`fenced append: seq ${fenced.seq}`);
}
console.log("lock released");

// 5. Admission: wait for room for the need, run the work, release when it settles.
const reservation = await berth.admit(
  [start("web", { memory: "256M", cpu: 0.5 })],
  async (admission) => {
    console.log(`admitted ${admission.reservation.id} after ${admission.waitedMs} ms`);
    return admission.reservation.id;
  },
  {
    owner: "typescript demo web",
    maxWaitMs: 60_000,
    onQueued: (queued) => console.log(`queued #${queued.position}: ${queued.waitForText} (ETA: ${queued.etaBasis})`),
  },
);
console.log(`released ${reservation}`);

// 6. A deadline on any call.
const { lastSeq } = await berth.sessions.snapshot(session, { timeoutMs: 5_000 });
console.log(`done: ${session} ends at seq ${lastSeq}`);
