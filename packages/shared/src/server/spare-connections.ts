/**
 * The calls of spare connections: those the listener accepts over its share of the descriptor
 * limit, to answer and close (listener.ts). A health Check is answered as on any connection, so a
 * crowd of clients never hides the service from its health checker; every other call is refused
 * RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES with a RetryInfo, the refusal of a journal or lock file
 * that could not be opened, before its handler runs.
 */
import { createContextKey, type Interceptor } from "@connectrpc/connect";
import { BerthError } from "../errors.js";
import { TOO_MANY_OPEN_FILES, TOO_MANY_OPEN_FILES_RETRY_MS } from "../state-errors.js";

/** Set on the calls that arrived on a spare connection. */
export const spareConnectionKey = createContextKey(false, { description: "the call arrived on a spare connection" });

/** The one call a spare connection serves. */
const HEALTH_CHECK = "/grpc.health.v1.Health/Check";

/** The refusal of any other call on a spare connection. */
export function spareConnectionRefusal(): BerthError {
  return new BerthError(
    "resource_exhausted",
    "the service has no connection left for this call: as many clients as its share of the descriptor limit are connected (this spare connection answers health checks only, and closes); retry shortly, or raise its limit (ulimit -n)",
    undefined,
    { reason: TOO_MANY_OPEN_FILES, retryAfterMs: TOO_MANY_OPEN_FILES_RETRY_MS },
  );
}

/** Refuses every call of a spare connection but health Check. */
export function createSpareConnectionInterceptor(): Interceptor {
  return (next) => async (req) => {
    if (req.contextValues.get(spareConnectionKey) && `/${req.service.typeName}/${req.method.name}` !== HEALTH_CHECK) throw spareConnectionRefusal();
    return next(req);
  };
}
