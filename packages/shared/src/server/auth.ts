/**
 * The optional bearer token. When a token is configured, every RPC except health needs
 * `authorization: Bearer <token>`: health stays open so that orchestrators and `berth up` can
 * probe a server without holding its secret.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import type { Interceptor } from "@connectrpc/connect";
import { BerthError } from "../errors.js";
import { berthErrorToConnect, errorDomainOf } from "./connect-errors.js";

/** Services that answer without a token. */
export const UNAUTHENTICATED_SERVICES: ReadonlySet<string> = new Set(["grpc.health.v1.Health"]);

/** What a client without the right token is told. */
export const UNAUTHENTICATED_MESSAGE = "missing or wrong bearer token: set authorization: Bearer <token> (the server's BERTH_TOKEN or token file)";

/**
 * True when `header` (an `authorization` header value) carries `token`. The comparison runs on
 * SHA-256 digests so it takes the same time whatever the presented value and its length.
 */
export function bearerTokenMatches(header: string | null, token: string): boolean {
  return headerMatchesDigest(header, digest(token));
}

/** An interceptor refusing, with UNAUTHENTICATED, every call outside health that lacks `token`. */
export function createAuthInterceptor(token: string): Interceptor {
  if (token.length === 0) throw new Error("the bearer token must not be empty");
  const expected = digest(token);
  return (next) => async (req) => {
    if (!UNAUTHENTICATED_SERVICES.has(req.service.typeName)) {
      const header = req.header.get("authorization");
      if (!headerMatchesDigest(header, expected)) {
        throw berthErrorToConnect(
          new BerthError("unauthenticated", UNAUTHENTICATED_MESSAGE, undefined, { reason: header === null ? "TOKEN_MISSING" : "TOKEN_INVALID" }),
          errorDomainOf(`/${req.service.typeName}/`),
        );
      }
    }
    return next(req);
  };
}

const BEARER = /^Bearer[ \t]+(.+?)[ \t]*$/i;

function headerMatchesDigest(header: string | null, expected: Buffer): boolean {
  const match = header === null ? null : BEARER.exec(header);
  return match !== null && timingSafeEqual(digest(match[1]!), expected);
}

function digest(value: string): Buffer {
  return createHash("sha256").update(value, "utf8").digest();
}
