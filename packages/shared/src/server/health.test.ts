import { describe, expect, it } from "vitest";
import { Code, createClient, createRouterTransport } from "@connectrpc/connect";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { createHealthService, HealthStatus, ServingStatus } from "./health.js";
import { shuttingDownError } from "./streams.js";

describe("HealthStatus", () => {
  it("tells subscribers about changes only, and nothing after unsubscribing", () => {
    const health = new HealthStatus();
    const seen: ServingStatus[] = [];
    const unsubscribe = health.subscribe("svc", (status) => seen.push(status));
    health.setStatus("svc", ServingStatus.SERVING);
    health.setStatus("svc", ServingStatus.SERVING);
    health.setStatus("other", ServingStatus.NOT_SERVING);
    health.setStatus("svc", ServingStatus.NOT_SERVING);
    unsubscribe();
    health.setStatus("svc", ServingStatus.SERVING);
    expect(seen).toEqual([ServingStatus.SERVING, ServingStatus.NOT_SERVING]);
  });

  it("turns everything NOT_SERVING for good on shutdown", () => {
    const health = new HealthStatus();
    health.setStatus("", ServingStatus.SERVING);
    health.setStatus("svc", ServingStatus.SERVING);
    health.shutdown();
    health.setStatus("svc", ServingStatus.SERVING);
    expect([...health.entries()]).toEqual([
      ["", ServingStatus.NOT_SERVING],
      ["svc", ServingStatus.NOT_SERVING],
    ]);
  });
});

describe("Health service", () => {
  function setup() {
    const health = new HealthStatus();
    const shutdown = new AbortController();
    const client = createClient(
      Health,
      createRouterTransport((router) => router.service(Health, createHealthService(health)), { router: { shutdownSignal: shutdown.signal } }),
    );
    return { health, shutdown, client };
  }

  it("checks the empty name and service names; unknown names are NOT_FOUND", async () => {
    const { health, client } = setup();
    health.setStatus("", ServingStatus.SERVING);
    health.setStatus("svc", ServingStatus.NOT_SERVING);
    expect((await client.check({})).status).toBe(ServingStatus.SERVING);
    expect((await client.check({ service: "svc" })).status).toBe(ServingStatus.NOT_SERVING);
    await expect(client.check({ service: "nope" })).rejects.toMatchObject({ code: Code.NotFound });
  });

  it("gives a slow watcher the latest status rather than a backlog", async () => {
    const { health, client } = setup();
    health.setStatus("svc", ServingStatus.SERVING);
    const abort = new AbortController();
    const stream = client.watch({ service: "svc" }, { signal: abort.signal })[Symbol.asyncIterator]();
    expect((await stream.next()).value?.status).toBe(ServingStatus.SERVING);
    health.setStatus("svc", ServingStatus.NOT_SERVING);
    health.setStatus("svc", ServingStatus.SERVICE_UNKNOWN);
    health.setStatus("svc", ServingStatus.NOT_SERVING);
    expect((await stream.next()).value?.status).toBe(ServingStatus.NOT_SERVING);
    health.setStatus("svc", ServingStatus.SERVING);
    expect((await stream.next()).value?.status).toBe(ServingStatus.SERVING);
    abort.abort();
  });

  it("sends NOT_SERVING before ending with the shutdown signal's UNAVAILABLE", async () => {
    const { health, shutdown, client } = setup();
    health.setStatus("", ServingStatus.SERVING);
    const stream = client.watch({})[Symbol.asyncIterator]();
    expect((await stream.next()).value?.status).toBe(ServingStatus.SERVING);
    health.shutdown();
    shutdown.abort(shuttingDownError());
    expect((await stream.next()).value?.status).toBe(ServingStatus.NOT_SERVING);
    await expect(stream.next()).rejects.toMatchObject({ code: Code.Unavailable });
  });
});
