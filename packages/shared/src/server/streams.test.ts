import { describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { abortable, abortError, shuttingDownError } from "./streams.js";
import { codeName, onStreamEnd, protocolOf } from "./logging.js";

async function* stuckAfter<T>(first: T, finished: { value: boolean }): AsyncGenerator<T> {
  try {
    yield first;
    await new Promise(() => {});
  } finally {
    finished.value = true;
  }
}

describe("abortable", () => {
  it("ends a blocked iteration with the signal's ConnectError reason", async () => {
    const controller = new AbortController();
    const it = abortable(stuckAfter(1, { value: false }), controller.signal)[Symbol.asyncIterator]();
    expect(await it.next()).toEqual({ done: false, value: 1 });
    const pending = it.next();
    controller.abort(shuttingDownError());
    await expect(pending).rejects.toMatchObject({ code: Code.Unavailable, rawMessage: "server shutting down" });
  });

  it("turns a reason that is not a ConnectError into CANCELED", () => {
    const controller = new AbortController();
    controller.abort();
    expect(abortError(controller.signal).code).toBe(Code.Canceled);
  });

  it("passes items and completion through when never aborted", async () => {
    async function* three() {
      yield* [1, 2, 3];
    }
    const seen: number[] = [];
    for await (const n of abortable(three(), new AbortController().signal)) seen.push(n);
    expect(seen).toEqual([1, 2, 3]);
  });
});

describe("onStreamEnd", () => {
  async function drain(source: AsyncIterable<number>): Promise<void> {
    for await (const _ of source) void _;
  }

  it("reports completion, an error, or an early stop, exactly once", async () => {
    const ends: unknown[] = [];
    async function* ok() {
      yield 1;
    }
    async function* failing() {
      yield 1;
      throw new ConnectError("gone", Code.NotFound);
    }
    await drain(onStreamEnd(ok(), (e) => ends.push(codeName(e))));
    await expect(drain(onStreamEnd(failing(), (e) => ends.push(codeName(e))))).rejects.toThrow("gone");
    for await (const _ of onStreamEnd(ok(), (e) => ends.push(codeName(e)))) break;
    expect(ends).toEqual(["ok", "not_found", "canceled"]);
  });
});

describe("protocolOf", () => {
  it("tells the three protocols apart by content type", () => {
    expect(protocolOf("application/grpc")).toBe("grpc");
    expect(protocolOf("application/grpc+proto")).toBe("grpc");
    expect(protocolOf("application/grpc-web+proto")).toBe("grpc-web");
    expect(protocolOf("application/json")).toBe("connect");
    expect(protocolOf("application/connect+proto")).toBe("connect");
    expect(protocolOf(null)).toBe("connect");
  });
});
