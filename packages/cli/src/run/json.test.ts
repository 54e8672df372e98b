import { create } from "@bufbuild/protobuf";
import { GetStateResponseSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { WatchSessionsRequestSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { describe, expect, it } from "vitest";
import { jsonInteger, messageJson } from "./json.js";

describe("--json's integers", () => {
  it("are JSON numbers: 64-bit fields nested, in lists and in maps; Timestamps and Durations keep their strings", () => {
    const state = create(GetStateResponseSchema, {
      committed: { memoryBytes: 2n * 1024n ** 3n, cpu: 1.5, items: [{ what: "in flight: a", memoryBytes: 3n }] },
      reservations: [{ id: "r-a", start: { memoryBytes: 512n }, admitTime: { seconds: 1_700_000_000n, nanos: 0 } }],
      policy: { maxWait: { seconds: 600n, nanos: 0 }, memoryBytes: 7n },
      queueSize: 3,
    });
    expect(messageJson(GetStateResponseSchema, state)).toMatchObject({
      committed: { memoryBytes: 2147483648, cpu: 1.5, items: [{ what: "in flight: a", memoryBytes: 3 }] },
      reservations: [{ id: "r-a", start: { memoryBytes: 512 }, admitTime: "2023-11-14T22:13:20Z" }],
      policy: { maxWait: "600s", memoryBytes: 7 },
      queueSize: 3,
    });
    expect(messageJson(WatchSessionsRequestSchema, create(WatchSessionsRequestSchema, { resumeFrom: { a: 4n, b: 9n } }))).toEqual({
      resumeFrom: { a: 4, b: 9 },
    });
    expect(messageJson(SnapshotSchema, create(SnapshotSchema, { id: "s", pendingEventSeq: 12n }))).toMatchObject({ id: "s", pendingEventSeq: 12 });
  });

  it("stay strings beyond 2^53 − 1, where a JSON number would round", () => {
    expect(jsonInteger(9007199254740991n)).toBe(9007199254740991);
    expect(jsonInteger(-9007199254740991n)).toBe(-9007199254740991);
    expect(jsonInteger(9007199254740993n)).toBe("9007199254740993");
    const big = create(GetStateResponseSchema, { policy: { memoryBytes: 2n ** 60n } });
    expect(messageJson(GetStateResponseSchema, big)).toMatchObject({ policy: { memoryBytes: "1152921504606846976" } });
  });
});
