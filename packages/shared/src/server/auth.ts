/**
 * The optional bearer token. When a token is configured, every RPC except health needs
 * `authorization: Bearer <token>`: health stays open so that orchestrators and `berth up` can
 * probe a server without holding its secret. The token is checked before the request's body is
 * read (see `route-guard.ts`): a caller without it learns nothing from how its bytes decode.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { ANY_CALL_REASONS } from "@berth/wire/reasons";
import { BerthError } from "../errors.js";

/** Services that answer without a token. */
export const UNAUTHENTICATED_SERVICES: ReadonlySet<string> = new Set(["grpc.health.v1.Health"]);

/** What a client without the right token is told. */
export const UNAUTHENTICATED_MESSAGE = "missing or wrong bearer token: set authorization: Bearer <token> (the server's BERTH_TOKEN or token file)";

/** The reasons of a refused token. */
export const TOKEN_REASONS = { TOKEN_MISSING: ANY_CALL_REASONS.TOKEN_MISSING, TOKEN_INVALID: ANY_CALL_REASONS.TOKEN_INVALID } as const;

/**
 * True when `header` (an `authorization` header value) carries `token`. The comparison runs on
 * SHA-256 digests so it takes the same time whatever the presented value and its length.
 */
export function bearerTokenMatches(header: string | null, token: string): boolean {
  return headerMatchesDigest(header, digest(token));
}

/**
 * A check of `authorization` headers against `token`: undefined when the header carries it, else
 * the UNAUTHENTICATED refusal (TOKEN_MISSING without a header, TOKEN_INVALID with a wrong one).
 */
export function createTokenCheck(token: string): (header: string | null) => BerthError | undefined {
  if (token.length === 0) throw new Error("the bearer token must not be empty");
  const expected = digest(token);
  return (header) => {
    if (headerMatchesDigest(header, expected)) return undefined;
    const reason = header === null ? TOKEN_REASONS.TOKEN_MISSING : TOKEN_REASONS.TOKEN_INVALID;
    return new BerthError("unauthenticated", UNAUTHENTICATED_MESSAGE, undefined, { reason });
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
