/**
 * The request side of a bidirectional stream: messages pushed as the caller decides, read by the
 * transport as an async iterable that stays open until `end()` (etcd ends a watch or keepalive
 * stream whose request side ends).
 */
export interface RequestQueue<T> extends AsyncIterable<T> {
  push(message: T): void;
  /** Ends the request side once the pushed messages are read. */
  end(): void;
}

export function createRequestQueue<T>(): RequestQueue<T> {
  const pending: T[] = [];
  let ended = false;
  let wake: (() => void) | undefined;
  return {
    push(message) {
      if (ended) return;
      pending.push(message);
      wake?.();
    },
    end() {
      ended = true;
      wake?.();
    },
    async *[Symbol.asyncIterator]() {
      for (;;) {
        while (pending.length > 0) yield pending.shift()!;
        if (ended) return;
        await new Promise<void>((resolve) => (wake = resolve));
        wake = undefined;
      }
    },
  };
}
