import { describe, expect, it, vi } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { abortable, abortError, endOnAbort, shuttingDownError } from "./streams.js";
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

  it("listens on the signal once per stream, not once per item, and stops listening at the end", async () => {
    const controller = new AbortController();
    const add = vi.spyOn(controller.signal, "addEventListener");
    const remove = vi.spyOn(controller.signal, "removeEventListener");
    async function* many() {
      for (let i = 0; i < 100; i++) yield i;
    }
    let count = 0;
    for await (const _ of abortable(many(), controller.signal)) count++;
    expect(count).toBe(100);
    expect(add).toHaveBeenCalledTimes(1);
    expect(remove).toHaveBeenCalledTimes(1);
    // Ended early by the consumer, or by the source's error: the listener goes too.
    for await (const _ of abortable(many(), controller.signal)) break;
    async function* failing() {
      yield 1;
      throw new Error("boom");
    }
    await expect(
      (async () => {
        for await (const _ of abortable(failing(), controller.signal)) void _;
      })(),
    ).rejects.toThrow("boom");
    expect(add).toHaveBeenCalledTimes(3);
    expect(remove).toHaveBeenCalledTimes(3);
  });

  it("a consumer returning while a pull waits answers that pull and stops listening", async () => {
    const controller = new AbortController();
    const remove = vi.spyOn(controller.signal, "removeEventListener");
    const it = abortable(stuckAfter(1, { value: false }), controller.signal)[Symbol.asyncIterator]();
    expect(await it.next()).toEqual({ done: false, value: 1 });
    const pending = it.next();
    void it.return!();
    expect(await pending).toEqual({ done: true, value: undefined });
    expect(remove).toHaveBeenCalledTimes(1);
  });

  it("refuses the next pull once aborted between pulls, and tells the source to stop", async () => {
    const controller = new AbortController();
    const finished = { value: false };
    async function* endless() {
      try {
        for (let i = 0; ; i++) yield i;
      } finally {
        finished.value = true;
      }
    }
    const it = abortable(endless(), controller.signal)[Symbol.asyncIterator]();
    expect(await it.next()).toEqual({ done: false, value: 0 });
    controller.abort(shuttingDownError());
    await expect(it.next()).rejects.toMatchObject({ code: Code.Unavailable });
    await new Promise((resolve) => setImmediate(resolve));
    expect(finished.value).toBe(true);
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

describe("endOnAbort", () => {
  /** A watcher whose pending `next()` resolves done once it is returned, as a store's watcher does. */
  function watcher() {
    let finish: ((result: IteratorResult<number>) => void) | undefined;
    let returned = 0;
    const it: AsyncIterator<number> = {
      next: () => new Promise((resolve) => (finish = resolve)),
      return: async () => {
        returned++;
        finish?.({ done: true, value: undefined });
        return { done: true, value: undefined };
      },
    };
    return { it, returned: () => returned };
  }

  it("ends the watcher's pending next() when the signal aborts", async () => {
    const w = watcher();
    const controller = new AbortController();
    endOnAbort(w.it, controller.signal);
    const pending = w.it.next();
    controller.abort();
    await expect(pending).resolves.toEqual({ done: true, value: undefined });
    expect(w.returned()).toBe(1);
  });

  it("ends it at once when the signal has aborted already (its abort event will not come again)", () => {
    const w = watcher();
    endOnAbort(w.it, AbortSignal.abort());
    expect(w.returned()).toBe(1);
  });

  it("leaves the watcher alone once the listener is removed", () => {
    const w = watcher();
    const controller = new AbortController();
    const stop = endOnAbort(w.it, controller.signal);
    stop();
    controller.abort();
    expect(w.returned()).toBe(0);
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

  it("passes every item through untouched and reports a source that throws at once", async () => {
    const items = [{ n: 1 }, { n: 2 }];
    async function* two() {
      yield* items;
    }
    const seen: unknown[] = [];
    const ends: unknown[] = [];
    for await (const item of onStreamEnd(two(), (e) => ends.push(codeName(e)))) seen.push(item);
    expect(seen[0]).toBe(items[0]);
    expect(seen[1]).toBe(items[1]);
    const throwing: AsyncIterable<number> = {
      [Symbol.asyncIterator]: () => ({
        next: () => {
          throw new ConnectError("at once", Code.Internal);
        },
      }),
    };
    await expect(drain(onStreamEnd(throwing, (e) => ends.push(codeName(e))))).rejects.toThrow("at once");
    expect(ends).toEqual(["ok", "internal"]);
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
