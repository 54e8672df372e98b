/**
 * Stopping the budget service while an Admit stream holds an admission: the stream gets its final
 * message (UNAVAILABLE) and the server stops as soon as that is out, not at a timer. The client
 * keeps its side of the stream open, as `berth admit` does while its command runs.
 *
 * Every timer that could end the wait instead is set to ten minutes (the queue's heartbeat, the
 * server's stream grace and drain timeout): if the stop completes at all, events alone ended it.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { afterEach, expect, it } from "vitest";
import { BudgetService, type AdmitRequestSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { implement, startServer } from "@berth/shared/server/index";
import { WIRE_PROTOCOLS, connectOver } from "@berth/shared/server/testing/wire-protocols";
import { ManualSampler, createBudget, defaultPolicy } from "../index.js";
import { createBudgetHandlers } from "./budget-handlers.js";
import { G, pushable, startItem } from "./testing.js";

const TEN_MINUTES = 600_000;
const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

it.each(WIRE_PROTOCOLS.filter((p) => p.name === "gRPC" || p.name === "Connect JSON"))(
  "a shutdown ends an admitted $name stream with UNAVAILABLE and stops once that is sent, with no timer involved",
  async (protocol) => {
    const sampler = new ManualSampler({ availableBytes: 64 * G, totalBytes: 64 * G, cores: 8, load1: 0 });
    const policy = { ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }), memoryBytes: 8 * G, cpu: 4, reserveBytes: G, heartbeatMs: TEN_MINUTES };
    const budget = await createBudget({ policy, sampler });
    const logged: string[] = [];
    const log = (_fields: Record<string, unknown>, message?: string) => void logged.push(message ?? "");
    const server = await startServer({
      name: "budget",
      logger: { debug: log, info: log, warn: log, error: log },
      services: [
        implement(BudgetService, createBudgetHandlers({ budget, defaultLeaseTtlMs: () => 30_000, maxLeaseTtlMs: () => 3_600_000, sampleIntervalMs: 1000 })),
      ],
      onShutdown: [() => budget.close()],
      streamGraceMs: TEN_MINUTES,
      drainTimeoutMs: TEN_MINUTES,
    });
    cleanups.push(() => server.close(false));
    const connection = connectOver(protocol, server.url);
    cleanups.push(connection.close);

    const requests = pushable<MessageInitShape<typeof AdmitRequestSchema>>();
    requests.push({ kind: { case: "start", value: { owner: "web", need: { items: [startItem("web", 1, 1)] } } } });
    // Never ended: the client is still "running its command".
    const stream = createClient(BudgetService, connection.transport).admit(requests)[Symbol.asyncIterator]();
    expect((await stream.next()).value?.kind.case).toBe("admitted");
    expect(budget.state().reservations).toHaveLength(1);

    const events: string[] = [];
    const final = stream.next().then(
      (result) => void events.push(result.done === true ? "ended cleanly" : "another message"),
      (error: unknown) => void events.push(`final: ${Code[ConnectError.from(error).code]}`),
    );
    await server.close();
    events.push("stopped");
    await final;
    expect(events).toEqual(["final: Unavailable", "stopped"]);
    expect(logged).not.toContain("connections still open at the drain timeout: dropping them");
    // And the admission went with its stream.
    expect(budget.state().reservations).toHaveLength(0);
  },
  15_000,
);
