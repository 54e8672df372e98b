/**
 * For the handler tests: budgets served in memory and closed after each test, an Admit stream the
 * test drives message by message, and what a refusal carries besides its message.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import type { NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema, AdmitResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import type { InMemoryBudget, InMemoryOptions } from "./testing.js";
import { pushable, serveInMemory, startItem } from "./testing.js";
type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;
type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;

/** Serves budgets in memory (`serve`), and closes every one served (`closeAll`, for `afterEach`). */
export function inMemoryServers() {
  const servers: InMemoryBudget[] = [];
  return {
    async serve(options: InMemoryOptions = {}) {
      const server = await serveInMemory(options);
      servers.push(server);
      return server;
    },
    async closeAll() {
      await Promise.all(servers.splice(0).map((s) => s.close()));
    },
  };
}

/** An Admit stream driven by the test: `send` a message, `next` the answer. */
export function openAdmit(
  server: InMemoryBudget,
  owner: string,
  items: NeedItemInit[] = [],
  options: { maxWaitMs?: number; start?: boolean; requestId?: string } = {},
) {
  const requests = pushable<AdmitRequestInit>();
  const controller = new AbortController();
  if (options.start !== false) {
    requests.push({
      kind: {
        case: "start",
        value: {
          owner,
          need: { items },
          requestId: options.requestId ?? "",
          maxWait:
            options.maxWaitMs === undefined ? undefined : { seconds: BigInt(Math.floor(options.maxWaitMs / 1000)), nanos: (options.maxWaitMs % 1000) * 1e6 },
        },
      },
    });
  }
  const responses = server.client.admit(requests, { signal: controller.signal })[Symbol.asyncIterator]();
  const received: AdmitResponse[] = [];
  let failure: ConnectError | undefined;
  let ended = false;
  // Read continuously, as a real client does; tests look at what arrived.
  const reading = (async () => {
    try {
      for (;;) {
        const result = await responses.next();
        if (result.done) break;
        received.push(result.value);
      }
    } catch (error) {
      failure = ConnectError.from(error);
    } finally {
      ended = true;
    }
  })();
  return {
    requests,
    received,
    send: (request: AdmitRequestInit) => requests.push(request),
    /** Ends the call from the client's side: a cancel by default (over a real connection, RST_STREAM CANCEL). */
    cancel: (reason: unknown = new ConnectError("cancelled by the client", Code.Canceled)) => controller.abort(reason),
    /** The connection breaks under the stream (the service sees no reason, as Node gives it). */
    breakConnection: () => controller.abort(new Error("socket hang up")),
    get failure() {
      return failure;
    },
    get ended() {
      return ended;
    },
    /** Waits until `predicate` holds for what arrived (or the stream ended). */
    async until(predicate: () => boolean) {
      const end = Date.now() + 5000;
      while (!predicate() && !ended && Date.now() < end) await new Promise((resolve) => setTimeout(resolve, 2));
      return predicate();
    },
    last: () => received[received.length - 1],
    done: reading,
  };
}

export const startNeed = (name: string, memoryGb: number, cpu: number) => [startItem(name, memoryGb, cpu)];

/** The error's ErrorInfo (reason, domain) and RetryInfo delay in ms (undefined without one). */
export function errorInfo(error: ConnectError | undefined) {
  const [info] = error?.findDetails(ErrorInfoSchema) ?? [];
  const [retry] = error?.findDetails(RetryInfoSchema) ?? [];
  return { reason: info?.reason, domain: info?.domain, retryAfterMs: retry?.retryDelay === undefined ? undefined : durationMs(retry.retryDelay) };
}
