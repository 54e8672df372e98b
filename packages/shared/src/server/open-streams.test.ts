import { describe, expect, it } from "vitest";
import { createContextValues } from "@connectrpc/connect";
import { OpenStreams, openStreamKey, streamHolds } from "./open-streams.js";

describe("OpenStreams", () => {
  it("counts per method (declared ones at 0) and lists the longest open first, with whose turn it is", () => {
    const streams = new OpenStreams();
    streams.declare("/a.S/Watch");
    streams.declare("/a.S/Hold");
    const cancelled = new AbortController();
    const older = streams.open("/a.S/Hold", "127.0.0.1:1", "grpc", 1_000, cancelled.signal);
    const newer = streams.open("/a.S/Watch", "127.0.0.1:2", "connect", 4_000, new AbortController().signal);
    expect([...streams.counts()]).toEqual([
      ["/a.S/Watch", 1],
      ["/a.S/Hold", 1],
    ]);

    newer.pulled();
    older.produced();
    older.holds = "the lock on a.css";
    cancelled.abort(new Error("http/2 stream closed with error code CANCEL (0x8)"));
    const listed = streams.list(older.since + 2_000);
    expect(listed.map((s) => s.method)).toEqual(["/a.S/Hold", "/a.S/Watch"]);
    expect(listed[0]).toMatchObject({
      peer: "127.0.0.1:1",
      messages: 1,
      waitingOn: "client",
      waitingSeconds: 2,
      holds: "the lock on a.css",
      aborted: "http/2 stream closed with error code CANCEL (0x8)",
    });
    expect(listed[1]).toMatchObject({ messages: 0, waitingOn: "handler", holds: "" });
    expect(listed[1]).not.toHaveProperty("aborted");

    streams.close(older);
    streams.close(older);
    expect(streams.size).toBe(1);
    expect(streams.counts().get("/a.S/Hold")).toBe(0);
  });

  it("lets a handler say what its stream holds through its context, and ignores a context without a stream", () => {
    const streams = new OpenStreams();
    const open = streams.open("/a.S/Hold", "unix", "grpc", 0, new AbortController().signal);
    streamHolds({ values: createContextValues().set(openStreamKey, open) }, "reservation r1");
    expect(open.holds).toBe("reservation r1");
    expect(() => streamHolds({ values: createContextValues() }, "nothing")).not.toThrow();
  });
});
