/**
 * The streams a server has open now, each with what an operator needs to tell a live stream from
 * one left behind: its method, its peer, how long it has been open, where it waits (for its
 * handler's next message, or for the client to take the last one) and what its handler says it
 * holds. `berth_streams_open{method}` counts them; `GET /debug/streams` lists them.
 *
 * Recording costs a few field writes per message: every message of every stream passes here.
 */
import { createContextKey, type HandlerContext } from "@connectrpc/connect";

/** One open stream, updated as its messages go out. */
export class OpenStream {
  /** Messages the handler produced so far. */
  messages = 0;
  /** True while a message is being written to the client; false while the handler is producing the next. */
  writing = false;
  /** When `writing` last changed (`performance.now()`). */
  since: number;
  /** What the handler holds, in its words ("the lock on src/a.css, fencing token 7"); empty when it said nothing. */
  holds = "";

  constructor(
    /** `/pkg.Service/Method` */
    readonly method: string,
    /** `address:port` of the client, or `unix`. */
    readonly peer: string,
    readonly protocol: string,
    /** When the call arrived (`performance.now()`). */
    readonly startedAt: number,
    /** The call's signal: aborted once the client went away, its deadline passed or the server shuts down. */
    readonly signal: AbortSignal,
  ) {
    this.since = startedAt;
  }

  /** The writer asks for the next message: the handler has the turn. */
  pulled(): void {
    this.writing = false;
    this.since = performance.now();
  }

  /** The handler produced a message: it is being written. */
  produced(): void {
    this.messages++;
    this.writing = true;
    this.since = performance.now();
  }
}

/** An open stream as `GET /debug/streams` shows it. */
export interface OpenStreamView {
  readonly method: string;
  readonly peer: string;
  readonly protocol: string;
  readonly openSeconds: number;
  readonly messages: number;
  /** `handler`: waiting for the handler's next message; `client`: waiting for the client to take one. */
  readonly waitingOn: "handler" | "client";
  readonly waitingSeconds: number;
  readonly holds: string;
  /** Why the call's signal aborted (the client went away, a deadline, shutdown), while the stream is still open; else absent. */
  readonly aborted?: string;
}

/** The open streams of one server, and their count per method. */
export class OpenStreams {
  private readonly streams = new Set<OpenStream>();
  private readonly byMethod = new Map<string, number>();

  /** Makes `method` appear (at 0) before any stream of it opens, so that the gauge has no gaps. */
  declare(method: string): void {
    if (!this.byMethod.has(method)) this.byMethod.set(method, 0);
  }

  open(method: string, peer: string, protocol: string, startedAt: number, signal: AbortSignal): OpenStream {
    const stream = new OpenStream(method, peer, protocol, startedAt, signal);
    this.streams.add(stream);
    this.byMethod.set(method, (this.byMethod.get(method) ?? 0) + 1);
    return stream;
  }

  close(stream: OpenStream): void {
    if (!this.streams.delete(stream)) return;
    this.byMethod.set(stream.method, (this.byMethod.get(stream.method) ?? 1) - 1);
  }

  /** How many are open, over every method. */
  get size(): number {
    return this.streams.size;
  }

  /** Open streams per method, every declared method included. */
  counts(): ReadonlyMap<string, number> {
    return this.byMethod;
  }

  /** The open streams, the longest open first. */
  list(now = performance.now()): OpenStreamView[] {
    const seconds = (ms: number) => Math.round(ms / 100) / 10;
    return [...this.streams]
      .sort((a, b) => a.startedAt - b.startedAt)
      .map((s) => ({
        method: s.method,
        peer: s.peer,
        protocol: s.protocol,
        openSeconds: seconds(now - s.startedAt),
        messages: s.messages,
        waitingOn: s.writing ? "client" : "handler",
        waitingSeconds: seconds(now - s.since),
        holds: s.holds,
        ...(s.signal.aborted ? { aborted: abortReason(s.signal) } : {}),
      }));
  }
}

function abortReason(signal: AbortSignal): string {
  const reason: unknown = signal.reason;
  if (reason instanceof Error) return reason.message;
  return reason === undefined ? "aborted" : String(reason);
}

/** The context value carrying a stream's record from the observer interceptor to its handler. */
export const openStreamKey = createContextKey<OpenStream | undefined>(undefined, { description: "berth open stream" });

/**
 * Says what a streaming handler holds now, for `GET /debug/streams` ("the lock on src/a.css,
 * fencing token 7"). Call it when that changes, not per message.
 */
export function streamHolds(context: Pick<HandlerContext, "values">, what: string): void {
  const stream = context.values.get(openStreamKey);
  if (stream !== undefined) stream.holds = what;
}
