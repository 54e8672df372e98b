import { create, fromBinary, toBinary, toJson } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { AdmitResponseSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { QueuedUpdate } from "../index.js";
import { committed, G, memoryReason, queueReason } from "./codec-fixtures.js";
import { QueuedEncoder } from "./queued-encoder.js";

describe("QueuedEncoder", () => {
  const ahead = Array.from({ length: 10 }, (_, i) => ({ owner: i === 3 ? "café ☕" : `waiter ${i}`, needs: { memoryBytes: (i + 1) * G, cpu: i / 2 } }));
  const updates: QueuedUpdate[] = [
    {
      position: 1,
      etaMs: 60_000,
      etaBasis: "when 'build' ends (it usually runs 1m (3 runs))",
      waitFor: [memoryReason],
      waitForText: memoryReason.message,
      ahead: [],
      aheadCount: 0,
    },
    {
      position: 2,
      etaMs: 1_234,
      etaBasis: "when 'db' ends (its lease runs out unless renewed), after the 1 ahead of it",
      waitFor: [queueReason(1), memoryReason],
      waitForText: `1 request(s) ahead in the queue; ${memoryReason.message}`,
      ahead: ahead.slice(0, 1),
      aheadCount: 1,
    },
    {
      position: 5000,
      etaMs: undefined,
      etaBasis: "unknown: a request ahead of it has no estimate — é",
      waitFor: [queueReason(4999), memoryReason],
      waitForText: "4999 request(s) ahead in the queue; é",
      ahead,
      aheadCount: 4999,
    },
    { position: 1, etaMs: 0, etaBasis: "", waitFor: [], waitForText: "", ahead: [], aheadCount: 0 },
    {
      position: 3,
      etaMs: 999,
      etaBasis: "the budget has room for it and the 2 ahead of it now",
      waitFor: [queueReason(2)],
      waitForText: "2 request(s) ahead in the queue",
      ahead: ahead.slice(0, 2),
      aheadCount: 2,
    },
  ];

  it.each(updates.map((u, i) => [i, u] as const))("encodes update %i to the same bytes as the reflective writer", (_i, update) => {
    const encoder = new QueuedEncoder(() => ({ committed }));
    const deadline = Date.UTC(2026, 0, 1, 12, 0, 0, 250);
    const fast = toBinary(AdmitResponseSchema, encoder.response(update, QueuedEncoder.deadline(deadline), true));
    const reference = toBinary(AdmitResponseSchema, create(AdmitResponseSchema, { kind: { case: "queued", value: encoder.encode(update, deadline) } }));
    expect(Buffer.from(fast).toString("hex")).toBe(Buffer.from(reference).toString("hex"));
    const decoded = fromBinary(AdmitResponseSchema, fast);
    expect(decoded.kind.case).toBe("queued");
    if (decoded.kind.case === "queued") expect(decoded.kind.value.position).toBe(update.position);
  });

  it("gives a call that is not binary the real message (JSON serialization skips a pre-encoded field)", () => {
    const encoder = new QueuedEncoder(() => ({ committed }));
    const deadline = QueuedEncoder.deadline(Date.UTC(2026, 0, 1, 12));
    const response = encoder.response(updates[2]!, deadline, false);
    expect(response.$unknown).toBeUndefined();
    expect(response.kind).toEqual({ case: "queued", value: encoder.encode(updates[2]!, deadline.ms) });
    expect(toJson(AdmitResponseSchema, response)).toMatchObject({
      queued: { position: 5000, etaBasis: "unknown: a request ahead of it has no estimate — é", waitForText: "4999 request(s) ahead in the queue; é" },
    });
    expect(toJson(AdmitResponseSchema, encoder.response(updates[1]!, deadline, false))).toMatchObject({ queued: { eta: "1.234s" } });
    expect((toJson(AdmitResponseSchema, response) as { queued: object }).queued).not.toHaveProperty("eta");
  });
});
