/** An iterator of nothing (what a session with no journal reads as). */
export function emptyIterator<T>(): AsyncIterableIterator<T> {
  return {
    next: () => Promise.resolve({ value: undefined, done: true }),
    return: () => Promise.resolve({ value: undefined, done: true }),
    [Symbol.asyncIterator]() {
      return this;
    },
  };
}
