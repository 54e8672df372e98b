import { describe, expect, it } from "vitest";
import { drainingBody } from "./request-drain.js";

function envelope(length: number, declared = length): Buffer {
  const out = Buffer.alloc(5 + length);
  out.writeUInt32BE(declared, 1);
  return out;
}

/** A body of `chunks` that records how far it was read and whether it was cut. */
function source(chunks: Buffer[]) {
  const state = { read: 0, cut: false };
  const body: AsyncIterable<Uint8Array> = {
    [Symbol.asyncIterator]() {
      let i = 0;
      return {
        next: async () => {
          if (i >= chunks.length) return { done: true, value: undefined };
          state.read += chunks[i]!.byteLength;
          return { done: false, value: chunks[i++]! };
        },
        return: async () => {
          state.cut = true;
          return { done: true, value: undefined };
        },
      };
    },
  };
  return { body, state, total: chunks.reduce((n, c) => n + c.byteLength, 0) };
}

/** Reads `n` chunks the way Connect does, then stops early (its for-await calls return). */
async function readThenStop(body: AsyncIterable<Uint8Array>, n: number): Promise<void> {
  let seen = 0;
  for await (const _chunk of body) if (++seen >= n) break;
}

describe("drainingBody", () => {
  it("reads the whole body of a one-message method that Connect stopped reading, and does not cut it", async () => {
    const { body, state, total } = source([envelope(10, 1000), Buffer.alloc(400), Buffer.alloc(600)]);
    const draining = drainingBody(body, { wholeBody: true });
    await readThenStop(draining.body, 1);
    expect([state.read, state.cut]).toEqual([total, false]);
  });

  it("reads a request stream only to the end of the message in flight, then cuts it as Connect would", async () => {
    const second = envelope(0, 300);
    const { body, state } = source([envelope(4), second, Buffer.alloc(100), Buffer.alloc(200), envelope(7), envelope(8)]);
    const draining = drainingBody(body, { wholeBody: false });
    await readThenStop(draining.body, 2);
    // The 300-byte message in flight is read (100 + 200 more bytes); the next message is not waited for.
    expect([state.read, state.cut]).toEqual([9 + 5 + 300, true]);
  });

  it("settles a body nobody read (a refusal before reading), at most the limit, then leaves it", async () => {
    const { body, state, total } = source([Buffer.alloc(100), Buffer.alloc(100), Buffer.alloc(100)]);
    await drainingBody(body, { wholeBody: true }).settle();
    expect(state.read).toBe(total);
    const big = source(Array.from({ length: 10 }, () => Buffer.alloc(100)));
    await drainingBody(big.body, { wholeBody: true, limitBytes: 250 }).settle();
    expect(big.state.read).toBe(300);
  });

  it("passes a body read to its end through untouched", async () => {
    const { body, state, total } = source([envelope(3), envelope(4)]);
    const draining = drainingBody(body, { wholeBody: false });
    const seen: number[] = [];
    for await (const chunk of draining.body) seen.push(chunk.byteLength);
    await draining.settle();
    expect([seen, state.read, state.cut]).toEqual([[8, 9], total, false]);
  });
});
