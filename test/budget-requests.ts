/**
 * What the budget service's tests share (budget-rpcs, -admit, -restarts and -paging .test.ts): a
 * start item of a declared cost, an Admit stream read continuously, and the state counts they poll.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import type { NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema, AdmitResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { pushable } from "@berth/budget/server/testing";
import { G, type BudgetUnderTest } from "./budget-e2e.js";

export type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;
export type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;

export const start = (name: string, memoryGb: number, cpu: number): NeedItemInit => ({
  kind: NeedItemKind.START,
  name,
  costSource: { case: "cost", value: { memoryBytes: BigInt(Math.round(memoryGb * G)), cpu } },
});

/** An Admit stream over the service's gRPC port (or through `client`), read continuously. */
export function admit(
  budget: BudgetUnderTest,
  owner: string,
  items: NeedItemInit[],
  maxWaitMs?: number,
  options: { requestId?: string; client?: BudgetUnderTest["client"] } = {},
) {
  const requests = pushable<AdmitRequestInit>();
  const controller = new AbortController();
  requests.push({
    kind: {
      case: "start",
      value: {
        owner,
        need: { items },
        requestId: options.requestId ?? "",
        maxWait: maxWaitMs === undefined ? undefined : { seconds: BigInt(Math.floor(maxWaitMs / 1000)), nanos: (maxWaitMs % 1000) * 1e6 },
      },
    },
  });
  const received: Array<AdmitResponse & { at: number }> = [];
  let failure: ConnectError | undefined;
  const done = (async () => {
    try {
      for await (const response of (options.client ?? budget.client).admit(requests, { signal: controller.signal }))
        received.push(Object.assign(response, { at: performance.now() }));
    } catch (error) {
      failure = ConnectError.from(error);
    } finally {
      // connect-node keeps its side of the HTTP/2 stream open while our request iterable waits:
      // end it, as a finished client would, so the server's graceful shutdown does not wait on it.
      requests.end();
    }
  })();
  return {
    received,
    done,
    get failure() {
      return failure;
    },
    send: (r: AdmitRequestInit) => requests.push(r),
    cancel: () => controller.abort(),
    has: (kind: string) => received.some((r) => r.kind.case === kind),
  };
}

export const queueLength = async (budget: BudgetUnderTest) => (await budget.client.getState({})).queue.length;
export const reservations = async (budget: BudgetUnderTest) => (await budget.client.getState({})).reservations.length;
