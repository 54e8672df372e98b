import { Code, ConnectError } from "@connectrpc/connect";
import { FenceRejectedSchema, IdempotencyKeyReusedSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { BadRequestSchema, ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { describe, expect, it } from "vitest";
import { BerthClientError, ERROR_DETAILS_METADATA } from "./errors.js";

describe("BerthClientError", () => {
  const connectError = new ConnectError(
    "the fence is stale",
    Code.FailedPrecondition,
    { [ERROR_DETAILS_METADATA]: JSON.stringify({ file: "/a.css", currentToken: 8 }) },
    [
      { desc: ErrorInfoSchema, value: { reason: "FENCE_REJECTED", domain: "berth.sessions" } },
      { desc: FenceRejectedSchema, value: { file: "/a.css", fencingToken: 7n, currentToken: 8n } },
      { desc: BadRequestSchema, value: { fieldViolations: [{ field: "fence", description: "stale" }] } },
    ],
    new Error("the cause"),
  );

  it("is a ConnectError with the same code, message, metadata and details", () => {
    const error = BerthClientError.from(connectError, [FenceRejectedSchema]);
    expect(error).toBeInstanceOf(ConnectError);
    expect(error).toBeInstanceOf(BerthClientError);
    expect(ConnectError.from(error)).toBe(error);
    expect(BerthClientError.from(error)).toBe(error);
    expect([error.code, error.rawMessage, error.message]).toEqual([Code.FailedPrecondition, "the fence is stale", "[failed_precondition] the fence is stale"]);
    expect((error.cause as Error).message).toBe("the cause");
    expect(error.findDetails(FenceRejectedSchema)).toHaveLength(1);
  });

  it("reads the reason, the typed detail of the schemas given, the bad request and the facts", () => {
    const error = BerthClientError.from(connectError, [FenceRejectedSchema, IdempotencyKeyReusedSchema]);
    expect(error.reason).toBe("FENCE_REJECTED");
    expect(error.errorInfo?.domain).toBe("berth.sessions");
    expect(error.fenceRejected).toMatchObject({ file: "/a.css", fencingToken: 7n, currentToken: 8n });
    expect(error.idempotencyKeyReused).toBeUndefined();
    expect(error.retryAfterMs).toBeUndefined();
    expect(error.badRequest?.fieldViolations[0]?.field).toBe("fence");
    expect(error.facts).toEqual({ file: "/a.css", currentToken: 8 });
    // Without its schema, a typed detail is not decoded.
    expect(BerthClientError.from(connectError).fenceRejected).toBeUndefined();
  });

  it("a plain ConnectError is not a BerthClientError; anything else becomes one with ConnectError's rules", () => {
    expect(connectError).not.toBeInstanceOf(BerthClientError);
    expect(BerthClientError.from(new Error("boom"))).toMatchObject({ code: Code.Unknown, rawMessage: "boom" });
    expect(BerthClientError.from(new Error("boom"), Code.Internal).code).toBe(Code.Internal);
    expect(BerthClientError.from(new DOMException("stop", "AbortError")).code).toBe(Code.Canceled);
  });
});
