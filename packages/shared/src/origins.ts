/**
 * Web page origins as `--cors-origin` takes them and browsers send them (`Origin`): a scheme, a
 * host and a port, nothing else.
 */
import { invalidArgument } from "./errors.js";

/**
 * An origin as a browser sends it: `http` or `https`, a host, maybe a port, nothing else. Returns
 * its canonical form (lower case, the scheme's default port dropped), as browsers serialize it.
 */
export function parseOrigin(raw: string, field: string): string {
  const text = raw.trim();
  if (text === "*") {
    throw invalidArgument(field, "must name each origin (http://localhost:3000): * would let a page on any site read this service");
  }
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw invalidArgument(field, `must be an origin such as http://localhost:3000, got ${JSON.stringify(raw)}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw invalidArgument(field, `must be an http or https origin, got ${JSON.stringify(raw)}`);
  }
  if (url.username !== "" || url.password !== "" || url.pathname !== "/" || url.search !== "" || url.hash !== "") {
    throw invalidArgument(field, `must be an origin alone (scheme, host and port, no path), got ${JSON.stringify(raw)}`);
  }
  return url.origin;
}

/** A comma-separated list of origins (`--cors-origin`, `BERTH_CORS_ORIGINS`), each checked by {@link parseOrigin}. */
export function parseOrigins(raw: string, field: string): readonly string[] {
  const origins = raw
    .split(",")
    .map((part) => part.trim())
    .filter((part) => part !== "")
    .map((part) => parseOrigin(part, field));
  if (origins.length === 0) throw invalidArgument(field, "must name at least one origin, e.g. http://localhost:3000");
  return [...new Set(origins)];
}
