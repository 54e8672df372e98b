/**
 * The page tokens of ListQueue, ListReservations and ListRunning (and GetState's first pages).
 *
 * A token names the last entry a page returned by its number in arrival order, never by its
 * position: whoever leaves the list between two pages, the next page starts right after that entry,
 * so nothing is repeated and nothing that stayed is skipped. The numbers live in the service's
 * memory, so a token also carries the instance that issued it: one from before a restart is refused
 * (INVALID_ARGUMENT), and the client lists again from the first page. Opaque to clients: base64url
 * of a small JSON object.
 */
import { randomBytes } from "node:crypto";
import { invalidArgument } from "@berth/shared/errors";

/** The lists that page. */
export type PagedList = "queue" | "reservations" | "running";

/** The page size when a request gives none (0). */
export const DEFAULT_PAGE_SIZE = 100;
/** The largest page: a larger `page_size` is treated as this. */
export const MAX_PAGE_SIZE = 1000;
/** The longest token accepted (the ones issued are about 60 characters). */
const MAX_TOKEN_LENGTH = 256;

/** A request's `page_size` as the number of entries to return: 0 is the default, above the maximum is the maximum, negative is refused. */
export function pageSizeOf(pageSize: number, field = "page_size"): number {
  if (!Number.isInteger(pageSize) || pageSize < 0) throw invalidArgument(field, `must be 0 (the default, ${DEFAULT_PAGE_SIZE}) or more; got ${pageSize}`);
  if (pageSize === 0) return DEFAULT_PAGE_SIZE;
  return Math.min(pageSize, MAX_PAGE_SIZE);
}

interface TokenBody {
  /** The list. */
  l: PagedList;
  /** The number of the last entry returned. */
  a: number;
  /** The issuing instance. */
  i: string;
}

/** Issues and reads the tokens of one service instance. */
export class PageTokens {
  /** Tells this instance's tokens from a previous one's. */
  private readonly instance = randomBytes(6).toString("base64url");

  /** The token of the page after the entry numbered `after` of `list`; "" when there is none. */
  encode(list: PagedList, after: number | undefined): string {
    if (after === undefined) return "";
    const body: TokenBody = { l: list, a: after, i: this.instance };
    return Buffer.from(JSON.stringify(body)).toString("base64url");
  }

  /** Where a request's `page_token` starts (undefined: the first page); INVALID_ARGUMENT naming `field` for anything not issued by this instance for `list`. */
  decode(list: PagedList, token: string, field = "page_token"): number | undefined {
    if (token === "") return undefined;
    const refuse = (rule: string) => invalidArgument(field, rule);
    if (token.length > MAX_TOKEN_LENGTH || !/^[A-Za-z0-9_-]+$/.test(token)) throw refuse("must be a next_page_token as the service returned it");
    let body: Partial<TokenBody>;
    try {
      body = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as Partial<TokenBody>;
    } catch {
      throw refuse("must be a next_page_token as the service returned it");
    }
    if (body === null || typeof body !== "object" || typeof body.a !== "number" || !Number.isSafeInteger(body.a) || body.a < 0 || typeof body.i !== "string") {
      throw refuse("must be a next_page_token as the service returned it");
    }
    if (body.l !== list) throw refuse(`is a token of another list (${String(body.l)}), not of ${list}`);
    if (body.i !== this.instance) throw refuse("was issued before the service restarted; list again from the first page");
    return body.a;
  }
}

/**
 * GetFleet's tokens name the last machine a page returned. Machines are keys in etcd, not numbers
 * in this instance's memory, so a token stays good across restarts and across the budgets of the
 * fleet: the next page starts after that name, whoever joined or left meanwhile.
 */
export const fleetTokens = {
  encode(after: string | undefined): string {
    return after === undefined ? "" : Buffer.from(JSON.stringify({ l: "fleet", m: after })).toString("base64url");
  },
  decode(token: string, field = "page_token"): string | undefined {
    if (token === "") return undefined;
    const refuse = () => invalidArgument(field, "must be a next_page_token as GetFleet returned it");
    if (token.length > 2 * MAX_TOKEN_LENGTH || !/^[A-Za-z0-9_-]+$/.test(token)) throw refuse();
    let body: { l?: unknown; m?: unknown };
    try {
      body = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as { l?: unknown; m?: unknown };
    } catch {
      throw refuse();
    }
    if (body === null || typeof body !== "object" || body.l !== "fleet" || typeof body.m !== "string" || body.m === "") throw refuse();
    return body.m;
  },
};
