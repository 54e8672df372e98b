/**
 * What every entry of this package knows of where the services are, without reading anything: the
 * services' names, their default addresses, and the error for an address no service can be
 * reached at. The Node entry's endpoint table (`endpoint.ts`) and the browser entry's options
 * (`web-connection.ts`) both start from here.
 */

/** The two services: `sessions` (journals and locks) and `budget`. */
export type ServiceName = "sessions" | "budget";

/** Where each service is when nothing says otherwise. */
export const DEFAULT_URLS: Readonly<Record<ServiceName, string>> = {
  sessions: "http://127.0.0.1:7301",
  budget: "http://127.0.0.1:7302",
};

/** A configuration no service can be reached with: a malformed URL, an unreadable or empty token file. */
export class EndpointError extends Error {
  override name = "EndpointError";
}

/** Whether `url` is `http(s)://HOST[:PORT]…`, the address of a service over TCP. */
export function isHttpUrl(url: string): boolean {
  return /^https?:\/\/[^/]+/.test(url);
}

/** A setting's value, or undefined when it is unset, empty or only blanks: every client counts those as unset. */
export function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === "" ? undefined : value;
}
