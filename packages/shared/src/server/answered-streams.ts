/**
 * An HTTP/2 call whose answer is complete while its client is still sending (a bidirectional
 * stream ended by the server: an Admit stream cut by shutdown, a refusal) must not stay open.
 *
 * Node closes such a stream by itself only when the handler never read the request and the
 * response has no trailers; an RPC reads its request and every response here ends with trailers
 * (the compat layer always asks for them). So the stream stayed half-open until the client ended
 * its side, and at shutdown the server waited for that until its drain timeout (5 s with one
 * admitted stream open, against 150 ms idle). RFC 9113, section 8.1: a server that has sent a
 * complete response may ask the client to stop sending with RST_STREAM NO_ERROR; gRPC servers do.
 */
import { constants, type Http2ServerResponse } from "node:http2";

/**
 * Closes `res`'s stream (RST_STREAM NO_ERROR, after the trailers) once its response is complete,
 * if its client is still sending. Most calls' clients have ended their side (every unary call):
 * their stream closes by itself once the trailers are out, and an RST_STREAM more would cost each
 * of them a frame and a turn of the event loop.
 */
export function closeWhenAnswered(res: Http2ServerResponse): void {
  const stream = res.stream;
  // The compat layer listened first: by now it has sent the trailers, the end of the answer.
  stream.once("wantTrailers", () => {
    if (clientEnded(stream)) return;
    setImmediate(() => {
      if (!stream.closed && !stream.destroyed) stream.close(constants.NGHTTP2_NO_ERROR);
    });
  });
}

/** Whether the client has sent END_STREAM on `stream` (nghttp2's own record: whether or not the handler read that far). */
function clientEnded(stream: Http2ServerResponse["stream"]): boolean {
  return stream.state.remoteClose === 1;
}
