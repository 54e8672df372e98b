/** Who a lock or an admission is for when the caller does not say. */
import { hostname, userInfo } from "node:os";

/** `user@host pid N`. */
export function defaultOwner(): string {
  let user = process.env.USER ?? "";
  try {
    user = userInfo().username;
  } catch {
    // no passwd entry (a container's arbitrary uid): keep $USER
  }
  return `${user || "someone"}@${hostname()} pid ${process.pid}`;
}
