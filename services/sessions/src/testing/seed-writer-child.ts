/**
 * A process appending to one journal as a seed process does, for the tests that race berth
 * against it. For each "go <sessionId>" line on stdin it appends `appends` events, one every
 * `intervalMs` (blocking in between, as the seed's synchronous code does), and answers
 * {"event":"done","seqs":[…]} with the seqs it gave them; "exit" ends it.
 * argv[2]: JSON {dir, appends, intervalMs, seedStore?: {module, project}} — with `seedStore`, the
 * seed's own `session-store.mjs` (a file URL) appends for the project; else the stand-in
 * (seed-writer.ts), which also writes the snapshot file after every append, as the seed does.
 */
import { readLineSync, say, sleepSync } from "../locks/testing/child-io.js";
import { seedAppend } from "./seed-writer.js";

interface Config {
  dir: string;
  appends: number;
  intervalMs: number;
  seedStore?: { module: string; project: string };
}
interface SeedModule {
  createLiveSessionStore(options: { cwd: string; sessionId: string }): { appendEvent(event: Record<string, unknown>): { pendingEventSeq?: unknown } };
}

const config = JSON.parse(process.argv[2]!) as Config;
const seedModule = config.seedStore ? ((await import(config.seedStore.module)) as SeedModule) : undefined;

say({ event: "ready", pid: process.pid });
for (let line = readLineSync(); line !== null && line !== "exit"; line = readLineSync()) {
  const id = line.slice("go ".length);
  const seqs: number[] = [];
  const store = seedModule?.createLiveSessionStore({ cwd: config.seedStore!.project, sessionId: id });
  for (let i = 0; i < config.appends; i++) {
    // A `steer` is pending from its own seq on: the seq the seed gave it, read back from its state.
    const event = { type: "steer", pageUrl: `seed-${i}` };
    if (store) seqs.push(Number(store.appendEvent({ ...event, id }).pendingEventSeq));
    else seqs.push(seedAppend({ dir: config.dir }, id, event, { snapshotFile: true }).seq);
    sleepSync(config.intervalMs);
  }
  say({ event: "done", seqs });
}
