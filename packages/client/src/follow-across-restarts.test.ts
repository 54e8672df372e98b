/**
 * Following a watch across restarts: bodies that end, fail and catch up as each test says, and a
 * real watch over Connect's router transport whose service is away for one stream.
 */
import { Code, ConnectError, createRouterTransport } from "@connectrpc/connect";
import { SessionService, type WatchSessionRequest } from "@berth/api/berth/sessions/v1/session_service_pb";
import { describe, expect, it } from "vitest";
import { followAcrossRestarts, tokenRefused, type FollowContext, type FollowState } from "./follow-across-restarts.js";
import { SessionsClient } from "./sessions.js";

/** A state as a line: `retrying 2 Unavailable`, `stopped Unauthenticated`. */
function line(state: FollowState): string {
  switch (state.kind) {
    case "retrying":
      return `retrying ${state.delayMs} ${state.error === undefined ? "ended" : Code[state.error.code]}`;
    case "stopped":
      return `stopped ${Code[state.error.code]}`;
    default:
      return state.kind;
  }
}

/** Follows with one scripted step a stream; the states heard, once following is over. */
async function follow(steps: readonly ((context: FollowContext, stop: AbortController) => Promise<void>)[], options: { isFinal?: typeof tokenRefused } = {}) {
  const stop = new AbortController();
  const states: string[] = [];
  let opened = 0;
  await followAcrossRestarts(
    async (context) => {
      const step = steps[opened++];
      if (step === undefined) throw new Error(`stream ${opened} was not expected`);
      await step(context, stop);
    },
    { signal: stop.signal, onState: (state) => states.push(line(state)), firstDelayMs: 1, maxDelayMs: 4, ...options },
  );
  return { states, opened };
}

const away =
  (code = Code.Unavailable) =>
  async () => {
    throw new ConnectError("the service is away", code);
  };
const caughtUpThenEnds = async (context: FollowContext) => context.live();
const stops = async (_context: FollowContext, stop: AbortController) => stop.abort();

describe("followAcrossRestarts", () => {
  it("opens the stream again after each end or failure, the wait doubling to the longest, and the first again once live", async () => {
    const { states } = await follow([away(), away(), away(), away(), caughtUpThenEnds, away(), stops]);
    expect(states).toEqual([
      "connecting",
      "retrying 1 Unavailable",
      "connecting",
      "retrying 2 Unavailable",
      "connecting",
      "retrying 4 Unavailable",
      "connecting",
      "retrying 4 Unavailable",
      "connecting",
      "live",
      "retrying 1 ended",
      "connecting",
      "retrying 2 Unavailable",
      "connecting",
    ]);
  });

  it("stops at a refusal no retry can mend: the token by default, and what the caller names", async () => {
    expect(await follow([away(Code.Unauthenticated)])).toEqual({ states: ["connecting", "stopped Unauthenticated"], opened: 1 });
    expect(await follow([away(Code.PermissionDenied)])).toEqual({ states: ["connecting", "stopped PermissionDenied"], opened: 1 });
    // Another refusal is retried unless the caller says it is final.
    expect((await follow([away(Code.FailedPrecondition), stops])).states).toEqual(["connecting", "retrying 1 FailedPrecondition", "connecting"]);
    const isFinal = (error: Parameters<typeof tokenRefused>[0]) => tokenRefused(error) || error.code === Code.NotFound;
    expect(await follow([away(Code.NotFound)], { isFinal })).toEqual({ states: ["connecting", "stopped NotFound"], opened: 1 });
  });

  it("stops when its signal aborts, during a stream (its failure then is not reported) or during the wait", async () => {
    const abortedStream = async (_context: FollowContext, stop: AbortController) => {
      stop.abort();
      throw new ConnectError("the call was cancelled", Code.Canceled);
    };
    expect(await follow([abortedStream])).toEqual({ states: ["connecting"], opened: 1 });

    const stop = new AbortController();
    const states: FollowState["kind"][] = [];
    let opened = 0;
    await followAcrossRestarts(
      async () => {
        opened++;
        throw new ConnectError("the service is away", Code.Unavailable);
      },
      {
        signal: stop.signal,
        // A wait longer than any test: following ends when the signal aborts, not when the wait does.
        firstDelayMs: 3_600_000,
        onState(state) {
          states.push(state.kind);
          if (state.kind === "retrying") stop.abort();
        },
      },
    );
    expect({ states, opened }).toEqual({ states: ["connecting", "retrying"], opened: 1 });
  });

  it("follows a session's watch through a service that was away for one stream, from where the caller says", async () => {
    const requests: WatchSessionRequest[] = [];
    const sessions = new SessionsClient({
      transport: createRouterTransport((router) =>
        router.service(SessionService, {
          async *watchSession(request) {
            requests.push(request);
            if (requests.length === 1) throw new ConnectError("connect ECONNREFUSED 127.0.0.1:7301", Code.Unavailable);
            yield { kind: { case: "caughtUp", value: { lastSeq: 3n } } };
          },
        }),
      ),
    });
    const stop = new AbortController();
    const states: string[] = [];
    let lastSeq = 2n;
    await followAcrossRestarts(
      async ({ signal, live }) => {
        for await (const event of sessions.watch("s", { fromSeq: lastSeq + 1n, signal })) {
          if (event.kind === "caughtUp") {
            lastSeq = event.lastSeq;
            live();
            stop.abort();
          }
        }
      },
      { signal: stop.signal, onState: (state) => states.push(line(state)), firstDelayMs: 1 },
    );
    expect(states).toEqual(["connecting", "retrying 1 Unavailable", "connecting", "live"]);
    expect(requests.map((request) => request.fromSeq)).toEqual([3n, 3n]);
    expect(lastSeq).toBe(3n);
  });
});
