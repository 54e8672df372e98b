/**
 * For the session handlers' tests: session stores in a temp dir on a manual clock, closed after
 * each test; a client of the handlers over an in-memory transport; events to append; and ways to
 * read what a call answered or refused.
 *
 * `dir` and `clock` are exported `let`s, which ES modules bind live: `setUpStores` (for
 * `beforeEach`) replaces them, and the tests see the current ones.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { type Code, type ConnectError, createClient, createRouterTransport, type Client } from "@connectrpc/connect";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { SessionService, type JournalEntry, type WatchedEntry, type WatchSessionResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { ManualClock } from "@berth/shared/clock";
import { createErrorInterceptor } from "@berth/shared/server/index";
import { expect } from "vitest";
import { type SessionStoreOptions, createSessionStore } from "../create-session-store.js";
import type { SessionStore } from "../session-store.js";
import { createSessionHandlers, type SessionHandlerOptions } from "./session-handlers.js";

export let dir: string;
export let clock: ManualClock;
const stores: SessionStore[] = [];

/** For `beforeEach`: a temp dir and a clock of the test's own. */
export function setUpStores(): void {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-handlers-"));
  clock = new ManualClock(Date.UTC(2026, 0, 1));
}

/** For `afterEach`: closes every store the test opened and removes its dir. */
export async function closeStores(): Promise<void> {
  for (const store of stores.splice(0)) await store.close().catch(() => undefined);
  fs.rmSync(dir, { recursive: true, force: true });
}

export function openStore(options: Partial<SessionStoreOptions> = {}): SessionStore {
  const store = createSessionStore({ dir: path.join(dir, "sessions"), clock, fsync: "none", ...options });
  stores.push(store);
  return store;
}

type SessionClient = Client<typeof SessionService>;

/**
 * Resolves once the store has `count` watchers: the server has subscribed the streams a test
 * opened. An append is durable within the same turn under fsync=none, so one made before the
 * server subscribed a watcher is, rightly, not live news to it.
 */
export async function watchersAt(store: SessionStore, count: number): Promise<void> {
  for (let turn = 0; store.stats().watchers < count; turn++) {
    if (turn > 100_000) throw new Error(`the store never had ${count} watchers`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** A client over an in-memory transport; `json` switches the Connect protocol to JSON messages. */
export function clientFor(store: SessionStore, options: Partial<SessionHandlerOptions> = {}, json = false): SessionClient {
  const transport = createRouterTransport((router) => router.service(SessionService, createSessionHandlers({ store, ...options })), {
    router: { interceptors: [createErrorInterceptor()] },
    transport: { useBinaryFormat: !json },
  });
  return createClient(SessionService, transport);
}

export function event(init: MessageInitShape<typeof EventSchema>["kind"]): Event {
  return create(EventSchema, { kind: init });
}

export const generate = (count = 3): Event => event({ case: "generate", value: { pageUrl: "http://localhost:3000/", count, token: "t-1" } });
export const phase = (name: string): Event => event({ case: "agentPhase", value: { phase: name, durationMs: 10 } });
export const complete = (): Event => event({ case: "complete", value: {} });
/** An event whose journal JSON is a little over `bytes` long. */
export const big = (bytes: number): Event => event({ case: "steer", value: { pageUrl: "m".repeat(bytes) } });

/** Resolves once `condition` holds, looking once per turn of the event loop. */
export async function until(condition: () => boolean): Promise<void> {
  for (let turn = 0; !condition(); turn++) {
    if (turn > 100_000) throw new Error("the condition never held");
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** The entries a WatchSession message carries (none for caught-up and progress messages). */
export function watched(message: WatchSessionResponse): WatchedEntry[] {
  return message.kind.case === "entries" ? message.kind.value.entries : [];
}

export function seqsOf(message: WatchSessionResponse): bigint[] {
  return watched(message).map((item) => item.entry!.seq);
}

/** The only entry of a WatchSession message that must hold exactly one. */
export function onlyEntry(message: WatchSessionResponse): JournalEntry {
  const entries = watched(message);
  if (entries.length !== 1) throw new Error(`expected one entry, got a ${String(message.kind.case)} message with ${entries.length}`);
  return entries[0]!.entry!;
}

/** The code and ErrorInfo reason of an error; the domain must be this service's. */
export function codeAndReason(error: ConnectError): [Code, string | undefined] {
  const [info] = error.findDetails(ErrorInfoSchema);
  expect(info?.domain).toBe("berth.sessions");
  return [error.code, info?.reason];
}

export { connectFailure as failure } from "@berth/shared/server/testing/connect-failure";

export async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}

export function journalLines(id: string): string[] {
  const file = path.join(dir, "sessions", `${id}.jsonl`);
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, "utf8").split("\n").filter(Boolean);
}
