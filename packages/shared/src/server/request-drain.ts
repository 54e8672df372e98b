/**
 * A request body Connect stops reading early (a message over the size limit, a refusal before the
 * body is read) is read on to the end of what the client is still sending, and thrown away, before
 * the answer goes out. Otherwise the client may never see the answer: Node's HTTP/2 client resets
 * its own stream (ENHANCE_YOUR_CALM) when an answer arrives while more than its session memory
 * (10 MB by default) waits to be sent, so a 12 MB gRPC request got INTERNAL instead of
 * RESOURCE_EXHAUSTED; and over HTTP/1.1 a request stream Connect gives up on is destroyed with its
 * socket, so the client meets EPIPE instead of the answer.
 *
 * What is still coming: for a method taking one request message, the whole body (the client
 * half-closes after it); for a request stream, the rest of the message in flight (the client may
 * keep its side open for more, and only the message it is writing fills its buffers). At most
 * {@link DRAIN_LIMIT_BYTES} are read this way; beyond, the request is cut as before.
 */

/** The most bytes read and thrown away from one request before its answer. */
export const DRAIN_LIMIT_BYTES = 64 * 1024 * 1024;

export interface DrainOptions {
  /** The method takes one request message: read the whole body. Otherwise the rest of the envelope in flight. */
  readonly wholeBody: boolean;
  /** Default {@link DRAIN_LIMIT_BYTES}. */
  readonly limitBytes?: number;
}

/** A request body whose early end reads on (see the module's comment). */
export interface DrainingBody {
  readonly body: AsyncIterable<Uint8Array>;
  /** Reads on what is still coming, if Connect did not read the body to its end. */
  settle(): Promise<void>;
}

/** Tracks 5-byte envelope framing over a byte stream: where the message in flight ends. */
class EnvelopeFraming {
  private header = Buffer.alloc(5);
  private headerFill = 0;
  private remaining = 0;

  /** True between two envelopes (nothing of a message is missing). */
  get atBoundary(): boolean {
    return this.headerFill === 0 && this.remaining === 0;
  }

  consume(chunk: Uint8Array): void {
    let offset = 0;
    while (offset < chunk.byteLength) {
      if (this.remaining > 0) {
        const take = Math.min(this.remaining, chunk.byteLength - offset);
        this.remaining -= take;
        offset += take;
        continue;
      }
      const take = Math.min(5 - this.headerFill, chunk.byteLength - offset);
      this.header.set(chunk.subarray(offset, offset + take), this.headerFill);
      this.headerFill += take;
      offset += take;
      if (this.headerFill === 5) {
        this.headerFill = 0;
        this.remaining = this.header.readUInt32BE(1);
      }
    }
  }
}

/** Wraps `source` (a request body, read once) so that an early end reads on; see {@link DrainingBody}. */
export function drainingBody(source: AsyncIterable<Uint8Array>, options: DrainOptions): DrainingBody {
  const limit = options.limitBytes ?? DRAIN_LIMIT_BYTES;
  const framing = new EnvelopeFraming();
  let iterator: AsyncIterator<Uint8Array> | undefined;
  let ended = false;
  let settling: Promise<void> | undefined;
  let pending: Promise<unknown> = Promise.resolve();

  const source$ = () => (iterator ??= source[Symbol.asyncIterator]());
  const next = (): Promise<IteratorResult<Uint8Array>> => {
    const result = source$()
      .next()
      .then((r) => {
        if (r.done === true) ended = true;
        else if (!options.wholeBody) framing.consume(r.value);
        return r;
      });
    pending = result.catch(() => undefined);
    return result;
  };

  const settle = (): Promise<void> =>
    (settling ??= (async () => {
      await pending;
      let read = 0;
      try {
        while (!ended && (options.wholeBody || !framing.atBoundary)) {
          // Too much to wait for: the request is cut (see the iterator's return).
          if (read > limit) return;
          const r = await next();
          if (r.done !== true) read += r.value.byteLength;
        }
      } catch {
        // The client went away or reset the stream: nothing left to wait for.
      }
    })());

  const body: AsyncIterable<Uint8Array> = {
    [Symbol.asyncIterator]: () => ({
      next,
      return: async (value?: unknown) => {
        await settle();
        // What the client may still send after the message in flight is cut, as Connect does.
        if (!ended) await source$().return?.();
        return { done: true, value: value as Uint8Array };
      },
    }),
  };
  return { body, settle };
}
