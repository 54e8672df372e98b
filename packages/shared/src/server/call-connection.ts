/**
 * Whether the connection a call came on is gone: what tells a stream whose connection broke (a
 * network that dropped it, a client process killed, a laptop lid) from one its client cancelled.
 * Over HTTP/2 both end the stream the same way (Node closes every stream of a connection whose
 * socket closed with RST_STREAM CANCEL, the code of a client's cancel), but a cancel leaves the
 * connection open.
 */
import type { Http2ServerResponse } from "node:http2";
import type { HandlerContext } from "@connectrpc/connect";
import { callStateKey } from "./logging.js";

/** The test of a request's connection the server records with the call (see CallState). */
export function connectionGoneOf(req: { readonly socket: { readonly destroyed: boolean } }, res: object): () => boolean {
  const session = (res as Partial<Pick<Http2ServerResponse, "stream">>).stream?.session;
  if (session !== undefined) return () => session.closed || session.destroyed;
  const socket = req.socket;
  return () => socket.destroyed;
}

/** True when the call's connection is gone; undefined when the server did not record it (a call served in memory). */
export function callConnectionGone(context: HandlerContext): boolean | undefined {
  return context.values.get(callStateKey)?.connectionGone?.();
}
