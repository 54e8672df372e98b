/** The bearer token on every call, the same on every transport of this package. */
import type { Interceptor } from "@connectrpc/connect";

/** The interceptor that sends `token` as `authorization: Bearer …` (none without a token). */
export function bearerInterceptors(token: string | undefined): Interceptor[] {
  if (token === undefined) return [];
  return [
    (next) => (req) => {
      req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    },
  ];
}
