/**
 * WatchLocks against a started sessions service, on each store and over gRPC and Connect: grants,
 * waiters joining and leaving, releases in order with growing revisions; the current state; one
 * file; a watcher that goes away and resumes from its last revision gets exactly what it missed; a
 * revision the service cannot replay gives the current state with reset; progress when idle;
 * invalid input refused naming the field; a watcher that stops reading is ended WATCHER_LAGGED
 * with the revision to resume from, and resuming there replays every change it missed.
 */
import { mkdirSync } from "node:fs";
import * as path from "node:path";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LockEventKind, LockService, LocksWatcherLaggedSchema, type WatchLocksResponse } from "@berth/api/berth/locks/v1/lock_service_pb";
import { callFailure, connectClient, makeTempDir, onStore, startService, stopAll, STORES, storeTags, type ServiceProcess } from "./harness.js";

afterAll(stopAll);

type Stream = AsyncIterator<WatchLocksResponse>;

function summary(message: WatchLocksResponse): string {
  const kind = message.kind;
  if (kind.case === "event") return `${LockEventKind[kind.value.kind]}:${kind.value.owner}:${kind.value.position}`;
  if (kind.case === "caughtUp") return `caught_up:${kind.value.reset}`;
  return kind.case ?? "none";
}

const revisionOf = (message: WatchLocksResponse): bigint => (message.kind.case === undefined ? 0n : message.kind.value.revision);

async function take(stream: Stream, n: number): Promise<WatchLocksResponse[]> {
  const out: WatchLocksResponse[] = [];
  while (out.length < n) {
    const step = await stream.next();
    if (step.done) throw new Error(`the stream ended after ${out.map(summary).join(", ")}`);
    out.push(step.value);
  }
  return out;
}

for (const store of STORES) {
  for (const protocol of ["grpc", "connect"] as const) {
    describe(`WatchLocks (${store} store, ${protocol})`, storeTags(store), () => {
      let service: ServiceProcess;
      let client: Client<typeof LockService>;
      let dir: string;
      beforeAll(async () => {
        dir = path.join(makeTempDir("berth-watch-locks-"), "project");
        mkdirSync(dir, { recursive: true });
        service = await startService("sessions", await onStore(store, {}));
        client = connectClient(LockService, service.url("sessions"), { protocol, defaultTimeoutMs: 60_000 });
      });
      const file = (name: string) => path.join(dir, name);

      it("sends grants, waiters joining and leaving and releases in order, with growing revisions", async () => {
        const stop = new AbortController();
        const watch = client.watchLocks({ file: file("a.ts") }, { signal: stop.signal })[Symbol.asyncIterator]();
        expect(summary((await take(watch, 1))[0]!)).toBe("caught_up:false");
        const first = await client.acquire({ file: file("a.ts"), owner: "one" });
        const leaving = new AbortController();
        const left = client.acquire({ file: file("a.ts"), owner: "two" }, { signal: leaving.signal }).catch(() => undefined);
        const [joined] = await take(watch, 2).then((m) => m.slice(1));
        expect(summary(joined!)).toBe("WAITER_JOINED:two:1");
        leaving.abort();
        await left;
        // The service sees the waiter leave when the cancel reaches it: waited for, not assumed.
        const [gone] = await take(watch, 1);
        const third = client.acquire({ file: file("a.ts"), owner: "three" });
        const rest = [gone!, ...(await take(watch, 1))];
        await client.release({ leaseToken: first.lease!.leaseToken });
        await third;
        const end = await take(watch, 2);
        const all = [joined!, ...rest, ...end];
        expect(all.map(summary)).toEqual(["WAITER_JOINED:two:1", "WAITER_LEFT:two:1", "WAITER_JOINED:three:1", "RELEASED:one:0", "GRANTED:three:0"]);
        const revisions = all.map(revisionOf);
        for (let i = 1; i < revisions.length; i++) expect(revisions[i]! >= revisions[i - 1]!).toBe(true);
        expect(revisions[1]! > revisions[0]!).toBe(true);
        stop.abort();
      });

      it("describes the current state of one file with include_current", async () => {
        const held = await client.acquire({ file: file("b.ts"), owner: "holder" });
        await client.acquire({ file: file("other.ts"), owner: "elsewhere" });
        const stop = new AbortController();
        const watch = client.watchLocks({ file: file("b.ts"), includeCurrent: true }, { signal: stop.signal })[Symbol.asyncIterator]();
        const [current, caughtUp] = await take(watch, 2);
        expect([summary(current!), summary(caughtUp!)]).toEqual(["CURRENT_HOLDER:holder:0", "caught_up:false"]);
        if (current!.kind.case === "event") expect(current!.kind.value.fencingToken).toBe(held.lease!.fencingToken);
        stop.abort();
      });

      it("resumes after a disconnect with exactly the changes missed, and resets from a revision it cannot replay", async () => {
        const stop = new AbortController();
        const watch = client.watchLocks({ file: file("c.ts") }, { signal: stop.signal })[Symbol.asyncIterator]();
        await take(watch, 1);
        const one = await client.acquire({ file: file("c.ts"), owner: "one" });
        const [granted] = await take(watch, 1);
        stop.abort();
        await client.release({ leaseToken: one.lease!.leaseToken });
        await client.acquire({ file: file("c.ts"), owner: "two" });
        const again = new AbortController();
        const resumed = client.watchLocks({ file: file("c.ts"), startRevision: revisionOf(granted!) }, { signal: again.signal })[Symbol.asyncIterator]();
        const replay = (await take(resumed, 3)).map(summary).filter((s) => !s.startsWith("caught_up"));
        expect(replay).toEqual(["RELEASED:one:0", "GRANTED:two:0"]);
        again.abort();
        const reset = new AbortController();
        const foreign = client
          .watchLocks({ file: file("c.ts"), startRevision: revisionOf(granted!) + 1_000_000_000_000n }, { signal: reset.signal })
          [Symbol.asyncIterator]();
        expect((await take(foreign, 2)).map(summary)).toEqual(["CURRENT_HOLDER:two:0", "caught_up:true"]);
        reset.abort();
      });

      it("sends progress when idle", async () => {
        const stop = new AbortController();
        const watch = client.watchLocks({ file: file("idle.ts"), progressInterval: durationFromMs(100) }, { signal: stop.signal })[Symbol.asyncIterator]();
        const [caughtUp, progress] = await take(watch, 2);
        expect(progress!.kind.case).toBe("progress");
        expect(revisionOf(progress!) >= revisionOf(caughtUp!)).toBe(true);
        stop.abort();
      });

      it("refuses invalid input naming the field", async () => {
        for (const [request, field] of [
          [{ file: "relative.ts" }, "file"],
          [{ startRevision: -1n }, "start_revision"],
          [{ progressInterval: durationFromMs(50) }, "progress_interval"],
        ] as const) {
          const error = await callFailure(take(client.watchLocks(request)[Symbol.asyncIterator](), 1));
          expect(error.code).toBe(Code.InvalidArgument);
          expect(error.rawMessage).toContain(field);
        }
      });
    });
  }
}

for (const store of STORES) {
  describe(`WatchLocks of a slow watcher (${store} store)`, storeTags(store), () => {
    it("ends a watcher that stops reading with WATCHER_LAGGED and the revision to resume from, which replays every change it missed", {
      timeout: 120_000,
    }, async () => {
      const dir = makeTempDir("berth-watch-lag-");
      // 4,000 changes: more than the 1,000 the service lets a watcher fall behind and what the
      // transport buffers, and no more than the file store's history (four times the buffer), so
      // on both stores the resume is a replay, not a reset.
      const service = await startService("sessions", await onStore(store, { args: ["--watch-buffer", "1000"] }));
      const client = connectClient(LockService, service.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 120_000 });
      const busy = path.join(dir, "busy.ts");
      const stop = new AbortController();
      const watch = client.watchLocks({ file: busy }, { signal: stop.signal })[Symbol.asyncIterator]();
      const [caughtUp] = await take(watch, 1);
      const expected: string[] = [];
      for (let i = 0; i < 2000; i++) {
        const lease = await client.acquire({ file: busy, owner: `o${i}` });
        await client.release({ leaseToken: lease.lease!.leaseToken });
        expected.push(`GRANTED:o${i}:0`, `RELEASED:o${i}:0`);
      }
      let last = revisionOf(caughtUp!);
      const seen: string[] = [];
      const error = await callFailure(
        (async () => {
          for (;;) {
            const step = await watch.next();
            if (step.done) throw new Error("the watch ended without an error");
            last = revisionOf(step.value);
            seen.push(summary(step.value));
          }
        })(),
      );
      expect(error.code).toBe(Code.ResourceExhausted);
      const [lagged] = error.findDetails(LocksWatcherLaggedSchema);
      expect(lagged?.resumeFromRevision).toBe(last);
      stop.abort();
      expect(seen.length).toBeLessThan(expected.length);

      const resumeStop = new AbortController();
      const resumed = client.watchLocks({ file: busy, startRevision: last }, { signal: resumeStop.signal })[Symbol.asyncIterator]();
      const markers: string[] = [];
      while (seen.length < expected.length || markers.length === 0) {
        const [message] = await take(resumed, 1);
        if (message!.kind.case === "caughtUp") markers.push(summary(message!));
        else seen.push(summary(message!));
      }
      resumeStop.abort();
      expect(markers).toEqual(["caught_up:false"]);
      expect(seen).toEqual(expected);
    });
  });
}
