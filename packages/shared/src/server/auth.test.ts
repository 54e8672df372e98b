import { describe, expect, it } from "vitest";
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import * as v1 from "@berth/api/grpc/reflection/v1/reflection_pb";
import { bearerTokenMatches, createAuthInterceptor } from "./auth.js";
import { createHealthService, HealthStatus, ServingStatus } from "./health.js";
import { createReflectionV1Service, ReflectionIndex } from "./reflection.js";

describe("bearerTokenMatches", () => {
  it("accepts only `Bearer <token>`, scheme case-insensitive", () => {
    expect(bearerTokenMatches("Bearer abc", "abc")).toBe(true);
    expect(bearerTokenMatches("bearer   abc ", "abc")).toBe(true);
    expect(bearerTokenMatches("Bearer abcd", "abc")).toBe(false);
    expect(bearerTokenMatches("Bearer ab", "abc")).toBe(false);
    expect(bearerTokenMatches("Basic abc", "abc")).toBe(false);
    expect(bearerTokenMatches("abc", "abc")).toBe(false);
    expect(bearerTokenMatches(null, "abc")).toBe(false);
  });
});

describe("createAuthInterceptor", () => {
  it("lets health through and refuses reflection without the token", async () => {
    const health = new HealthStatus();
    health.setStatus("", ServingStatus.SERVING);
    const transport = createRouterTransport(
      (router) => {
        router.service(Health, createHealthService(health));
        router.service(v1.ServerReflection, createReflectionV1Service(new ReflectionIndex([Health])));
      },
      { router: { interceptors: [createAuthInterceptor("t0ken")] } },
    );
    expect((await createClient(Health, transport).check({})).status).toBe(ServingStatus.SERVING);
    const reflection = createClient(v1.ServerReflection, transport);
    const list = async (headers?: Record<string, string>) => {
      async function* one() {
        yield { messageRequest: { case: "listServices" as const, value: "" } };
      }
      for await (const response of reflection.serverReflectionInfo(one(), { headers })) {
        return response.messageResponse.case;
      }
      return undefined;
    };
    const refusal = async (headers?: Record<string, string>) =>
      ConnectError.from(
        await list(headers).then(
          () => undefined,
          (e: unknown) => e,
        ),
      );
    const missing = await refusal();
    expect(missing.code).toBe(Code.Unauthenticated);
    expect(missing.findDetails(ErrorInfoSchema)[0]).toMatchObject({ reason: "TOKEN_MISSING", domain: "grpc.reflection" });
    const wrong = await refusal({ authorization: "Bearer nope" });
    expect(wrong.code).toBe(Code.Unauthenticated);
    expect(wrong.findDetails(ErrorInfoSchema)[0]?.reason).toBe("TOKEN_INVALID");
    await expect(list({ authorization: "Bearer t0ken" })).resolves.toBe("listServicesResponse");
  });

  it("refuses an empty token at construction", () => {
    expect(() => createAuthInterceptor("")).toThrow(/empty/);
  });
});
