import { create, type DescMessage, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { BerthClientError, clientError, EndpointError, InvalidEventError, LOCK_ERROR_DETAILS, SESSION_ERROR_DETAILS } from "@berth/client";
import { LockHeldSchema } from "@berth/api/berth/locks/v1/lock_service_pb";
import { FenceRejectedSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { describeFailure, mcpRefusal, toolError } from "./errors.js";

/** A refusal as a service sends it: ErrorInfo of its domain, and the details given. */
function refusal<D extends DescMessage>(
  code: Code,
  domain: string,
  reason: string,
  detail?: { desc: D; value: MessageInitShape<D> },
  extra: Array<{ desc: DescMessage; value: unknown }> = [],
): ConnectError {
  const details = [{ desc: ErrorInfoSchema, value: create(ErrorInfoSchema, { reason, domain, metadata: { file: "/p/a.ts" } }) }, ...extra];
  if (detail !== undefined) details.push({ desc: detail.desc, value: create(detail.desc, detail.value) });
  return new ConnectError("refused", code, undefined, details as never);
}

describe("describeFailure", () => {
  it("FENCE_REJECTED: the code, the reason, the tool to call and the proto's words, the typed facts, no stack", () => {
    const error = BerthClientError.from(
      refusal(Code.FailedPrecondition, "berth.sessions", "FENCE_REJECTED", {
        desc: FenceRejectedSchema,
        value: { file: "/p/a.ts", fencingToken: 3n, currentToken: 4n },
      }),
      SESSION_ERROR_DETAILS,
    );
    const failure = describeFailure(error);
    expect(failure).toMatchObject({
      code: "failed_precondition",
      reason: "FENCE_REJECTED",
      message: "refused",
      facts: { fenceRejected: { file: "/p/a.ts", fencingToken: "3", currentToken: "4" }, metadata: { file: "/p/a.ts" } },
    });
    expect(failure.advice).toMatch(/^This server no longer holds the lock under that token: call lock_acquire again/);
    expect(failure.advice).toMatch(/The service's own words: you lost the lock: re-acquire before writing$/);
    const text = (toolError(failure).content[0] as { text: string }).text;
    expect(text).toMatch(/^FAILED_PRECONDITION FENCE_REJECTED: refused\nWhat to do: /);
    expect(text).not.toMatch(/at .*\.ts:\d+/);
  });

  it("WAIT_EXHAUSTED of a lock: the holder and how long to wait before a retry", () => {
    const retry = { desc: RetryInfoSchema, value: create(RetryInfoSchema, { retryDelay: { seconds: 2n } }) };
    const error = BerthClientError.from(
      refusal(Code.ResourceExhausted, "berth.locks", "WAIT_EXHAUSTED", { desc: LockHeldSchema, value: { file: "/p/a.ts", owner: "vim", fencingToken: 9n } }, [
        retry,
      ]),
      LOCK_ERROR_DETAILS,
    );
    expect(describeFailure(error)).toMatchObject({ reason: "WAIT_EXHAUSTED", retryAfterMs: 2000, facts: { lockHeld: { owner: "vim", fencingToken: "9" } } });
    expect(describeFailure(error).advice).toMatch(/retry later \(RetryInfo\)/);
  });

  it("a service not there: UNAVAILABLE without a reason, and how to start or find it", () => {
    const cause = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:7301"), { code: "ECONNREFUSED" });
    const failure = describeFailure(BerthClientError.from(new ConnectError("connect ECONNREFUSED", Code.Unavailable, undefined, undefined, cause)));
    expect(failure).toMatchObject({ code: "unavailable", message: "connect ECONNREFUSED" });
    expect(failure.reason).toBeUndefined();
    expect(failure.advice).toMatch(/berth up/);
  });

  it("the client's own refusals: an event that breaks events.proto, a bad endpoint, a client error's reason", () => {
    expect(describeFailure(new InvalidEventError("events[0].generate.count", "must be a whole number"))).toMatchObject({
      code: "invalid_argument",
      reason: "INVALID_FIELD",
      message: "events[0].generate.count: must be a whole number",
    });
    expect(describeFailure(new EndpointError("bad URL"))).toMatchObject({ reason: "BAD_ENDPOINT" });
    const own = describeFailure(clientError("no fetch", Code.Unavailable, "FETCH_FAILED", { metadata: { origin: "x" } }));
    expect(own).toMatchObject({ reason: "FETCH_FAILED" });
    // The client's own metadata is not the service's facts.
    expect(own.facts).toBeUndefined();
  });

  it("a reason no table lists still gets advice by its code", () => {
    expect(describeFailure(BerthClientError.from(refusal(Code.InvalidArgument, "berth.sessions", "SOMETHING_NEW"))).advice).toMatch(/Fix the argument/);
  });
});

describe("mcpRefusal", () => {
  it("names the server's own reasons with what to do", () => {
    expect(toolError(mcpRefusal(Code.FailedPrecondition, "NOT_HELD_HERE", "no lock on /p/a.ts"))).toMatchObject({
      isError: true,
      structuredContent: { error: { code: "failed_precondition", reason: "NOT_HELD_HERE", advice: expect.stringMatching(/lock_acquire/) } },
    });
  });
});
