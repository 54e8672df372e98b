/**
 * WatchLocks against a started sessions service, on each store and over gRPC and Connect: grants,
 * waiters joining and leaving, releases in order with growing revisions; the current state; one
 * file; a watcher that goes away and resumes from its last revision gets exactly what it missed; a
 * revision the service cannot replay gives the current state with reset; progress when idle;
 * invalid input refused naming the field; a watcher that stops reading is ended WATCHER_LAGGED
 * with the revision to resume from, and resuming there misses nothing.
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
    it("ends a watcher that stops reading with WATCHER_LAGGED and the revision to resume from", { timeout: 120_000 }, async () => {
      const dir = makeTempDir("berth-watch-lag-");
      const service = await startService("sessions", await onStore(store, { args: ["--watch-buffer", "2"] }));
      const client = connectClient(LockService, service.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 120_000 });
      const stop = new AbortController();
      const watch = client.watchLocks({ file: path.join(dir, "busy.ts") }, { signal: stop.signal })[Symbol.asyncIterator]();
      const [caughtUp] = await take(watch, 1);
      // Not read while the changes pile up past what the transport buffers and the 2 the service allows.
      for (let i = 0; i < 2000; i++) {
        const lease = await client.acquire({ file: path.join(dir, "busy.ts"), owner: `o${i}` });
        await client.release({ leaseToken: lease.lease!.leaseToken });
      }
      let last = revisionOf(caughtUp!);
      const error = await callFailure(
        (async () => {
          for (;;) {
            const step = await watch.next();
            if (step.done) throw new Error("the watch ended without an error");
            last = revisionOf(step.value);
          }
        })(),
      );
      expect(error.code).toBe(Code.ResourceExhausted);
      const [lagged] = error.findDetails(LocksWatcherLaggedSchema);
      expect(lagged?.resumeFromRevision).toBe(last);
      stop.abort();
    });
  });
}
