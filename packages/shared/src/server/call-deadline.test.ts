import { afterEach, describe, expect, it, vi } from "vitest";
import { createContextValues, createHandlerContext, type HandlerContext } from "@connectrpc/connect";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { callTimeLeftMs } from "./call-deadline.js";
import { callStateKey } from "./logging.js";

const HOUR = 3_600_000;
const contexts: Array<{ abort(): void }> = [];
afterEach(() => {
  for (const context of contexts.splice(0)) context.abort();
  vi.restoreAllMocks();
  vi.useRealTimers();
});

/** A call's context as the server makes it on arrival: with the server's record of that moment, or (`recorded: false`) without. */
function arrive(timeoutMs: number | undefined, recorded = true): HandlerContext {
  const contextValues = createContextValues();
  if (recorded) contextValues.set(callStateKey, { peer: "test", started: performance.now(), arrivedAtWallMs: Date.now(), observed: false });
  const context = createHandlerContext({
    service: Health,
    method: Health.method.check,
    protocolName: "grpc",
    requestMethod: "POST",
    url: "http://127.0.0.1/grpc.health.v1.Health/Check",
    contextValues,
    ...(timeoutMs === undefined ? {} : { timeoutMs }),
  });
  contexts.push(context);
  return context;
}

describe("callTimeLeftMs", () => {
  it("counts down from the caller's timeout on the monotonic clock", () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    const start = performance.now();
    const now = vi.spyOn(performance, "now").mockReturnValue(start);
    const context = arrive(8_000);
    expect(callTimeLeftMs(context)).toBe(8_000);
    now.mockReturnValue(start + 5_000);
    expect(callTimeLeftMs(context)).toBe(3_000);
    now.mockReturnValue(start + 9_000);
    expect(callTimeLeftMs(context)).toBe(-1_000);
  });

  it("does not move when the wall clock steps after the call arrived, as connect's timeoutMs() does", () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    const start = performance.now();
    vi.spyOn(performance, "now").mockReturnValue(start);
    const context = arrive(8_000);
    vi.setSystemTime(Date.now() + 2 * HOUR);
    expect(context.timeoutMs()).toBe(8_000 - 2 * HOUR);
    expect(callTimeLeftMs(context)).toBe(8_000);
    vi.setSystemTime(Date.now() - 3 * HOUR);
    expect(context.timeoutMs()).toBe(8_000 + HOUR);
    expect(callTimeLeftMs(context)).toBe(8_000);
  });

  it("is undefined when the caller set no deadline, and connect's reading when the server recorded no arrival", () => {
    expect(callTimeLeftMs(arrive(undefined))).toBeUndefined();
    vi.useFakeTimers({ toFake: ["Date"] });
    const unrecorded = arrive(8_000, false);
    vi.setSystemTime(Date.now() + 1_000);
    expect(callTimeLeftMs(unrecorded)).toBe(7_000);
  });
});
