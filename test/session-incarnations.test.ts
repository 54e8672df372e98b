/**
 * A deleted session never comes back clean, on each store and over each of the four protocols
 * (gRPC, gRPC-Web, Connect binary, Connect JSON): a session created again under a deleted id
 * continues the deleted one's seqs, so an `expected_seq` of the old session is SEQ_CONFLICT; a
 * retried keyed (and fenced) append of the old session is told SESSION_DELETED and never written
 * again; a key with other events, or naming the deletion, is IDEMPOTENCY_KEY_REUSED; a read or a
 * watch from an old seq is SESSION_DELETED; a keyed DeleteSession repeated answers its first answer
 * (`duplicate`), even after the re-creation, and deletes nothing more. All of it holds across a
 * restart of the service.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, type Client, type ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { ExpectedState, IdempotencyKeyReusedSchema, SeqConflictSchema, SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import {
  callFailure,
  closeClient,
  connectClient,
  makeTempDir,
  onStore,
  startService,
  stopAll,
  STORES,
  storeTags,
  PROTOCOLS,
  type ServiceProcess,
} from "./harness.js";

afterAll(stopAll);

const event = (kind: MessageInitShape<typeof EventSchema>["kind"]): Event => create(EventSchema, { kind });
const generate = (count: number): Event => event({ case: "generate", value: { pageUrl: "http://localhost:3000/", count } });
const atSeq = (seq: bigint) => ({ case: "expectedSeq" as const, value: seq });
const noSession = { case: "expectedState" as const, value: ExpectedState.NO_SESSION };

function codeAndReason(error: ConnectError): [Code, string | undefined] {
  return [error.code, error.findDetails(ErrorInfoSchema)[0]?.reason];
}

async function readSeqs(client: Client<typeof SessionService>, sessionId: string, fromSeq = 0n): Promise<number[]> {
  const seqs: number[] = [];
  for await (const batch of client.readJournal({ sessionId, fromSeq })) for (const entry of batch.entries) seqs.push(Number(entry.seq));
  return seqs;
}

for (const store of STORES) {
  describe(`a deleted session's incarnation (${store} store)`, storeTags(store), () => {
    let service: ServiceProcess;
    let stateDir: string;
    let projectDir: string;
    let started: Promise<void>;
    beforeAll(() => {
      stateDir = makeTempDir("berth-incarnations-");
      projectDir = makeTempDir("berth-incarnations-project-");
      started = onStore(store, { stateDir }).then(async (options) => {
        service = await startService("sessions", options);
      });
      return started;
    });
    afterAll(async () => {
      await started;
      await service.stop();
    });

    /** The session (and lock file) a protocol's case re-creates: its name in the ids' alphabet. */
    const rebornId = (protocolName: string) => `reborn-${protocolName.replace(/[^A-Za-z0-9]+/g, "-")}`;

    for (const { name, options } of PROTOCOLS) {
      it(`over ${name}: re-created, the old expected seq, keys, fence and seqs are refused; a keyed deletion repeats its answer`, async () => {
        await started;
        const url = service.url("sessions");
        const sessions = connectClient(SessionService, url, options);
        const locks = connectClient(LockService, url, options);
        const id = rebornId(name);
        const file = `${projectDir}/${id}.ts`;

        // The old session: a keyed batch (seqs 1-2) and a keyed, fenced append (seq 3).
        await sessions.appendEvents({ sessionId: id, events: [generate(1), generate(2)], expected: noSession, idempotencyKey: "batch" });
        const { lease } = await locks.acquire({ file, owner: name, requestId: `lock-${id}` });
        const fence = { file, fencingToken: lease!.fencingToken };
        expect((await sessions.appendEvent({ sessionId: id, event: generate(3), idempotencyKey: "fenced", fence })).seq).toBe(3n);

        // Deleted with a key; its repeat answers the first answer.
        expect(await sessions.deleteSession({ sessionId: id, expectedSeq: 3n, idempotencyKey: "bye" })).toMatchObject({ lastSeq: 3n, duplicate: false });
        expect(await sessions.deleteSession({ sessionId: id, expectedSeq: 3n, idempotencyKey: "bye" })).toMatchObject({ lastSeq: 3n, duplicate: true });

        // Created again: it continues after the deleted one's last seq.
        expect((await sessions.appendEvent({ sessionId: id, event: generate(4), expected: noSession })).seq).toBe(4n);

        // A client that last saw the old session at seq 1 (or 3) is refused, nothing written.
        for (const stale of [1n, 3n]) {
          const conflict = await callFailure(sessions.appendEvent({ sessionId: id, event: generate(9), expected: atSeq(stale) }));
          expect(codeAndReason(conflict)).toEqual([Code.Aborted, "SEQ_CONFLICT"]);
          expect(conflict.findDetails(SeqConflictSchema)[0]).toMatchObject({ expectedSeq: stale, currentSeq: 4n });
        }
        // A retried keyed append of the old session: told where it went, never written again —
        // with its fence too, which still holds the lock.
        const batchAgain = await callFailure(sessions.appendEvents({ sessionId: id, events: [generate(1), generate(2)], idempotencyKey: "batch" }));
        expect(codeAndReason(batchAgain)).toEqual([Code.NotFound, "SESSION_DELETED"]);
        expect(batchAgain.rawMessage).toMatch(/was written \(seqs 1–2\) to the session deleted since at seq 3/);
        const fencedAgain = await callFailure(sessions.appendEvent({ sessionId: id, event: generate(3), idempotencyKey: "fenced", fence }));
        expect(codeAndReason(fencedAgain)).toEqual([Code.NotFound, "SESSION_DELETED"]);
        // The key with other events, or the deletion's key on an append: refused as reused.
        const other = await callFailure(sessions.appendEvent({ sessionId: id, event: generate(7), idempotencyKey: "fenced" }));
        expect(codeAndReason(other)).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);
        expect(other.findDetails(IdempotencyKeyReusedSchema)[0]).toMatchObject({ sessionId: id, idempotencyKey: "fenced", firstSeq: 3n, lastSeq: 3n });
        const deletionKey = await callFailure(sessions.appendEvent({ sessionId: id, event: generate(7), idempotencyKey: "bye" }));
        expect(codeAndReason(deletionKey)).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);

        // The deletion repeated after the re-creation: its first answer, and the new session stays.
        expect(await sessions.deleteSession({ sessionId: id, expectedSeq: 3n, idempotencyKey: "bye" })).toMatchObject({ lastSeq: 3n, duplicate: true });
        const otherDeletion = await callFailure(sessions.deleteSession({ sessionId: id, idempotencyKey: "bye" }));
        expect(codeAndReason(otherDeletion)).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);
        const appendKey = await callFailure(sessions.deleteSession({ sessionId: id, idempotencyKey: "batch" }));
        expect(codeAndReason(appendKey)).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);

        // Reads and watches from an old seq are told; from the start they read the new session.
        const readOld = await callFailure(readSeqs(sessions, id, 2n));
        expect(codeAndReason(readOld)).toEqual([Code.NotFound, "SESSION_DELETED"]);
        expect(readOld.rawMessage).toMatch(/now starts at seq 4/);
        const watchOld = await callFailure(
          (async () => {
            for await (const _ of sessions.watchSession({ sessionId: id, fromSeq: 3n })) return;
          })(),
        );
        expect(codeAndReason(watchOld)).toEqual([Code.NotFound, "SESSION_DELETED"]);
        expect(await readSeqs(sessions, id)).toEqual([4]);
        expect(await readSeqs(sessions, id, 4n)).toEqual([4]);
        expect(await sessions.getSnapshot({ sessionId: id })).toMatchObject({ lastSeq: 4n });
        closeClient(sessions);
        closeClient(locks);
      });
    }

    it("the tombstones outlive a restart: keys still answer, seqs still continue; GetLimits tells the window", async () => {
      await started;
      await service.stop();
      service = await startService("sessions", await onStore(store, { stateDir }));
      const sessions = connectClient(SessionService, service.url("sessions"), { protocol: "grpc" });
      const id = rebornId(PROTOCOLS[0]!.name);
      expect(await sessions.deleteSession({ sessionId: id, expectedSeq: 3n, idempotencyKey: "bye" })).toMatchObject({ lastSeq: 3n, duplicate: true });
      expect(codeAndReason(await callFailure(sessions.appendEvent({ sessionId: id, event: generate(3), idempotencyKey: "fenced" })))).toEqual([
        Code.NotFound,
        "SESSION_DELETED",
      ]);
      expect(await sessions.deleteSession({ sessionId: id, expectedSeq: 4n })).toMatchObject({ lastSeq: 4n, duplicate: false });
      expect((await sessions.appendEvent({ sessionId: id, event: generate(5) })).seq).toBe(5n);
      expect((await sessions.getLimits({})).idempotencyWindow).toMatchObject({ seconds: 3600n });
      closeClient(sessions);
    });
  });
}
