/**
 * The resources, each subscribable: a session's snapshot (`berth://sessions/{sessionId}`), the
 * locks (`berth://locks`) and the load budget (`berth://budget`). A subscription follows the
 * resource's watch (WatchSession, WatchLocks, WatchBudget) and sends `notifications/resources/updated`
 * when it changes, at most once per turn of the event loop: nothing polls.
 */
import { toJson } from "@bufbuild/protobuf";
import { McpError, SubscribeRequestSchema, UnsubscribeRequestSchema, type ReadResourceResult } from "@modelcontextprotocol/sdk/types.js";
import { ResourceTemplate, type McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { BerthClientError, SESSIONS_REASONS, type Berth } from "@berth/client";
import { GetStateResponseSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { HolderKind, LockEventKind, type LockEvent } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SnapshotSchema } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { msOfTimestamp } from "@berth/client/wire-time";
import { describeFailure } from "./errors.js";
import type { Holdings } from "./holdings.js";
import { SESSION_ID_PATTERN } from "./schemas.js";

/** The URIs. */
export const LOCKS_URI = "berth://locks";
export const BUDGET_URI = "berth://budget";
const SESSION_URI_PREFIX = "berth://sessions/";
export const SESSION_URI_TEMPLATE = `${SESSION_URI_PREFIX}{sessionId}`;

/** JSON-RPC's code for a resource that does not exist (the MCP specification's). */
const RESOURCE_NOT_FOUND = -32002;

/** What the resources read from. */
export interface ResourceContext {
  readonly berth: Berth;
  readonly holdings: Holdings;
  /** Where a subscription's troubles go (stderr): stdout is the protocol's. */
  readonly log: (message: string) => void;
}

/** The current locks of every file, as WatchLocks describes them before `caughtUp`. */
async function currentLocks(berth: Berth): Promise<Array<Record<string, unknown>>> {
  const files = new Map<string, { holder?: Record<string, unknown>; waiters: Array<Record<string, unknown>> }>();
  for await (const event of berth.locks.watch(undefined, { includeCurrent: true })) {
    if (event.kind === "caughtUp") break;
    if (event.kind !== "event") continue;
    const lock = event.event;
    const entry = files.get(lock.file) ?? { waiters: [] };
    files.set(lock.file, entry);
    if (lock.kind === LockEventKind.CURRENT_HOLDER) entry.holder = holderJson(lock);
    else if (lock.kind === LockEventKind.CURRENT_WAITER) entry.waiters.push({ owner: lock.owner, position: lock.position });
  }
  return [...files].map(([file, { holder, waiters }]) => ({
    file,
    ...(holder === undefined ? {} : { holder }),
    waiters: waiters.sort((a, b) => (a.position as number) - (b.position as number)),
  }));
}

function holderJson(lock: LockEvent): Record<string, unknown> {
  return {
    owner: lock.owner,
    fencingToken: String(lock.fencingToken),
    kind: lock.holderKind === HolderKind.STREAM ? "stream" : "lease",
    ...(lock.time === undefined ? {} : { since: new Date(msOfTimestamp(lock.time)).toISOString() }),
  };
}

/** A failed read as the protocol's error, with the agent's reading of it as data. */
function readFailure(error: unknown, uri: string): McpError {
  const failure = describeFailure(error);
  const notFound = error instanceof BerthClientError && error.reason === SESSIONS_REASONS.SESSION_NOT_FOUND;
  return new McpError(notFound ? RESOURCE_NOT_FOUND : -32603, `${uri}: ${failure.reason ?? failure.code}: ${failure.message}. ${failure.advice}`, failure);
}

function json(uri: string, value: unknown): ReadResourceResult {
  return { contents: [{ uri, mimeType: "application/json", text: JSON.stringify(value) }] };
}

/** Registers the resources on `mcp` and answers subscriptions; `close` ends every subscription's watch. */
export function registerResources(mcp: McpServer, context: ResourceContext): { close(): void } {
  const { berth, holdings } = context;
  mcp.registerResource(
    "session",
    new ResourceTemplate(SESSION_URI_TEMPLATE, {
      // The sessions not yet completed; a completed one is read by its URI all the same.
      list: async () => {
        const resources = [];
        for await (const snapshot of berth.sessions.list()) {
          resources.push({
            uri: `${SESSION_URI_PREFIX}${snapshot.id}`,
            name: snapshot.id,
            title: `session ${snapshot.id} (${snapshot.phase || "no phase"})`,
            mimeType: "application/json",
          });
        }
        return { resources };
      },
    }),
    {
      title: "A session's snapshot",
      description:
        "The session's state derived from its journal (phase, pending event, checkpoints, variants, …) and its last seq. Subscribe: updated at each append.",
      mimeType: "application/json",
    },
    async (uri, variables) => {
      const sessionId = String(variables.sessionId);
      try {
        const response = await berth.sessions.snapshot(sessionId);
        return json(uri.href, {
          sessionId,
          lastSeq: Number(response.lastSeq),
          snapshot: response.snapshot === undefined ? undefined : toJson(SnapshotSchema, response.snapshot),
        });
      } catch (error) {
        throw readFailure(error, uri.href);
      }
    },
  );
  mcp.registerResource(
    "locks",
    LOCKS_URI,
    {
      title: "The source locks",
      description:
        "Every file locked or waited for now: its holder (owner, fencing token, since when) and its waiters in order; heldHere lists the files this server holds. Subscribe: updated at each grant, release, expiry, waiter joining or leaving.",
      mimeType: "application/json",
    },
    async (uri) => {
      try {
        return json(uri.href, { locks: await currentLocks(berth), heldHere: holdings.locks().map((held) => held.file) });
      } catch (error) {
        throw readFailure(error, uri.href);
      }
    },
  );
  mcp.registerResource(
    "budget",
    BUDGET_URI,
    {
      title: "The load budget",
      description:
        "What the budget holds: committed memory and cpu, the queue (place, ETA, what each waits for), reservations, running services, policy, the last machine sample. Subscribe: updated at each change of the queue, reservations, running tally or policy.",
      mimeType: "application/json",
    },
    async (uri) => {
      try {
        const state = await berth.budget.state();
        return json(uri.href, {
          ...(toJson(GetStateResponseSchema, state) as object),
          heldHere: holdings.admissions().map((held) => held.admission.reservation.id),
        });
      } catch (error) {
        throw readFailure(error, uri.href);
      }
    },
  );

  const subscriptions = new Subscriptions(mcp, context);
  mcp.server.registerCapabilities({ resources: { subscribe: true } });
  mcp.server.setRequestHandler(SubscribeRequestSchema, async (request) => {
    await subscriptions.subscribe(request.params.uri);
    return {};
  });
  mcp.server.setRequestHandler(UnsubscribeRequestSchema, async (request) => {
    subscriptions.unsubscribe(request.params.uri);
    return {};
  });
  return { close: () => subscriptions.close() };
}

/** The first delay before following a watch again after it failed; doubling up to the longest. */
const REFOLLOW_FIRST_MS = 100;
const REFOLLOW_MAX_MS = 5_000;

/** What a followed watch reports: it caught up (what it reports from now on is new), or the resource changed. */
type WatchNews = "caughtUp" | "changed";

/** The subscribed resources, each following its watch. */
class Subscriptions {
  readonly #watches = new Map<string, AbortController>();
  readonly #pending = new Set<string>();

  constructor(
    private readonly mcp: McpServer,
    private readonly context: ResourceContext,
  ) {}

  /**
   * Follows `uri`'s watch; resolves once the watch has caught up, so that every change after the
   * subscription is answered is notified. Rejects when the watch fails before (the service is not
   * there), or for a URI that names no resource.
   */
  async subscribe(uri: string): Promise<void> {
    if (this.#watches.has(uri)) return;
    const news = this.newsOf(uri);
    const controller = new AbortController();
    this.#watches.set(uri, controller);
    try {
      await new Promise<void>((resolve, reject) => void this.follow(uri, news, controller.signal, { resolve, reject }));
    } catch (error) {
      this.unsubscribe(uri);
      throw readFailure(error, uri);
    }
  }

  unsubscribe(uri: string): void {
    this.#watches.get(uri)?.abort();
    this.#watches.delete(uri);
  }

  close(): void {
    for (const controller of this.#watches.values()) controller.abort();
    this.#watches.clear();
  }

  /** The news of the resource at `uri` from a watch opened now; throws for a URI that names no resource. */
  private newsOf(uri: string): (signal: AbortSignal) => AsyncIterable<WatchNews> {
    const { berth } = this.context;
    // The current state first (skipped): its end, caughtUp, says the watch is live.
    const revisionNews = async function* (events: AsyncIterable<{ kind: string }>): AsyncGenerator<WatchNews> {
      let caughtUp = false;
      for await (const event of events) {
        if (event.kind === "caughtUp") {
          if (!caughtUp) yield "caughtUp";
          caughtUp = true;
        } else if (caughtUp && (event.kind === "event" || event.kind === "resumed")) yield "changed";
      }
    };
    if (uri === LOCKS_URI) return (signal) => revisionNews(berth.locks.watch(undefined, { includeCurrent: true, signal }));
    if (uri === BUDGET_URI) return (signal) => revisionNews(berth.budget.watchBudget({ includeCurrent: true, signal }));
    const sessionId = uri.startsWith(SESSION_URI_PREFIX) ? decodeURIComponent(uri.slice(SESSION_URI_PREFIX.length)) : undefined;
    if (sessionId === undefined || !SESSION_ID_PATTERN.test(sessionId))
      throw new McpError(RESOURCE_NOT_FOUND, `no resource ${uri}: berth's are ${SESSION_URI_TEMPLATE}, ${LOCKS_URI} and ${BUDGET_URI}`);
    return async function* (signal) {
      let lastSeq = 0n;
      try {
        lastSeq = (await berth.sessions.snapshot(sessionId, { signal })).lastSeq;
      } catch (error) {
        if (!(error instanceof BerthClientError && error.reason === SESSIONS_REASONS.SESSION_NOT_FOUND)) throw error;
      }
      // From the entry after the one read: what came between that read and the watch is news too.
      for await (const event of berth.sessions.watch(sessionId, { fromSeq: lastSeq + 1n, signal })) {
        if (event.kind === "caughtUp") yield "caughtUp";
        else if (event.kind === "entry" || event.kind === "resumed") yield "changed";
      }
    };
  }

  /**
   * Sends `updated` for each change, following the watch again after it fails (and telling of a
   * possible change then: what happened while it was down is not known). `first` hears the first
   * catch-up, or the failure before it.
   */
  private async follow(
    uri: string,
    news: (signal: AbortSignal) => AsyncIterable<WatchNews>,
    signal: AbortSignal,
    first: { resolve(): void; reject(error: unknown): void },
  ): Promise<void> {
    let followed = false;
    for (let failures = 0; !signal.aborted; ) {
      try {
        for await (const item of news(signal)) {
          if (item === "caughtUp") {
            if (!followed) first.resolve();
            else this.updated(uri);
            followed = true;
            failures = 0;
          } else this.updated(uri);
        }
      } catch (error) {
        if (signal.aborted) return;
        if (!followed) return first.reject(error);
        this.context.log(`berth mcp: following ${uri} failed (${describeFailure(error).message}); following it again`);
      }
      if (signal.aborted) return;
      await new Promise((resolve) => setTimeout(resolve, Math.min(REFOLLOW_MAX_MS, REFOLLOW_FIRST_MS * 2 ** failures++)));
    }
  }

  private updated(uri: string): void {
    if (this.#pending.has(uri)) return;
    this.#pending.add(uri);
    setImmediate(() => {
      this.#pending.delete(uri);
      if (this.#watches.has(uri)) this.mcp.server.sendResourceUpdated({ uri }).catch(() => {});
    });
  }
}
