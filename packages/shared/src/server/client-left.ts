/**
 * An HTTP/1.1 client that leaves while its call is pending ends that call at once, in the loop's
 * poll for I/O that reads it: its connection's end (FIN) or reset (RST) aborts the call's signal.
 *
 * connect-node aborts a call's signal (what drops a lock waiter or a queued admission) when the
 * response closes, and over HTTP/1.1 that is the socket's `close`: Node emits it once the socket's
 * handle is closed, in the loop's close phase, after the check phase where the lock table and the
 * budget's queue hand out (`clock.whenAwake`). So a waiter whose client had left was still queued
 * when its turn came, was granted, and its lease, answered into a closed connection, held the lock
 * for its whole ttl. (Over HTTP/2 a reset or closed connection closes its streams in the same poll.)
 *
 * A client's FIN while its answer is pending counts as leaving. Node's HTTP server already treats
 * it so: it ends its side of the connection at once, and an answer made afterwards is never
 * written. So nothing that worked is lost: a client that half-closes after sending its request
 * (`shutdown(SHUT_WR)`) still gets an answer made before its FIN is read, and never got a later
 * one. Connect and gRPC-Web clients (browsers, Node, curl) do not half-close. Between calls on a
 * keep-alive connection nothing is pending, and its end just closes it.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { Code, ConnectError } from "@connectrpc/connect";

/** The calls of each HTTP/1.1 connection whose answers are not complete yet, each told how the client left. */
const pendingCalls = new WeakMap<Socket, Set<(reason: ConnectError) => void>>();

/**
 * Ends the call of `req` (aborts its signal, CANCELED) when its client closes or resets the
 * connection before `res` is complete. Call it after handing `req` to connect-node, whose call
 * ends on its request's `error`.
 */
export function endCallWhenClientLeaves(req: IncomingMessage, res: ServerResponse): void {
  if (res.writableFinished) return;
  const end = (reason: ConnectError) => {
    // connect-node listens for its request's `error` until the response closes.
    if (!res.writableFinished && req.listenerCount("error") > 0) req.emit("error", reason);
  };
  const socket = req.socket;
  if (socket.readableEnded || socket.destroyed) {
    end(closedWhilePending());
    return;
  }
  const pending = callsOf(socket);
  const left = (reason: ConnectError) => {
    done();
    end(reason);
  };
  const done = () => {
    pending.delete(left);
    res.off("finish", done);
    res.off("close", done);
  };
  pending.add(left);
  res.once("finish", done);
  res.once("close", done);
}

/** The pending calls of `socket`, told when it ends or fails (one pair of listeners per connection). */
function callsOf(socket: Socket): Set<(reason: ConnectError) => void> {
  const known = pendingCalls.get(socket);
  if (known !== undefined) return known;
  const pending = new Set<(reason: ConnectError) => void>();
  pendingCalls.set(socket, pending);
  const tell = (reason: ConnectError) => {
    socket.off("end", onEnd);
    socket.off("error", onError);
    for (const call of [...pending]) call(reason);
  };
  const onEnd = () => tell(closedWhilePending());
  const onError = (error: Error) =>
    tell(new ConnectError(`the client's connection failed while the call was pending: ${error.message}`, Code.Canceled, undefined, undefined, error));
  socket.on("end", onEnd);
  socket.on("error", onError);
  return pending;
}

function closedWhilePending(): ConnectError {
  return new ConnectError("the client closed its connection while the call was pending", Code.Canceled);
}
