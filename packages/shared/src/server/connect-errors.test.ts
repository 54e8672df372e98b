import { describe, expect, it } from "vitest";
import { toJson } from "@bufbuild/protobuf";
import { StructSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { BerthError, invalidArgument, type BerthCode } from "../errors.js";
import { connectCodeOf, createErrorInterceptor, ERROR_DETAILS_HEADER, INTERNAL_ERROR_MESSAGE, toConnectError } from "./connect-errors.js";

describe("toConnectError", () => {
  it("maps every domain code to the Connect code of the same name", () => {
    const codes: Record<BerthCode, Code> = {
      invalid_argument: Code.InvalidArgument,
      not_found: Code.NotFound,
      already_exists: Code.AlreadyExists,
      failed_precondition: Code.FailedPrecondition,
      aborted: Code.Aborted,
      resource_exhausted: Code.ResourceExhausted,
      unavailable: Code.Unavailable,
      unauthenticated: Code.Unauthenticated,
      deadline_exceeded: Code.DeadlineExceeded,
      cancelled: Code.Canceled,
      internal: Code.Internal,
    };
    for (const [berth, connect] of Object.entries(codes)) expect(connectCodeOf(berth as BerthCode)).toBe(connect);
  });

  it("keeps the message and carries details as a Struct and an ASCII JSON header", () => {
    const error = toConnectError(new BerthError("aborted", "lock held by build-7 since 12:00", { holder: "build-7", seq: 10n, nested: { ok: true }, skip: undefined, name: "ünï" }));
    expect(error.code).toBe(Code.Aborted);
    expect(error.rawMessage).toBe("lock held by build-7 since 12:00");
    expect(toJson(StructSchema, error.findDetails(StructSchema)[0]!)).toEqual({ holder: "build-7", seq: "10", nested: { ok: true }, name: "ünï" });
    const header = error.metadata.get(ERROR_DETAILS_HEADER)!;
    expect(header).toMatch(/^[\x20-\x7e]+$/);
    expect(JSON.parse(header)).toEqual({ holder: "build-7", seq: "10", nested: { ok: true }, name: "ünï" });
  });

  it("adds nothing when there are no details", () => {
    const error = toConnectError(new BerthError("not_found", "no session abc"));
    expect(error.details).toEqual([]);
    expect(error.metadata.has(ERROR_DETAILS_HEADER)).toBe(false);
  });

  it("passes ConnectErrors through, maps aborts, hides everything else behind INTERNAL and logs it", () => {
    const original = new ConnectError("x", Code.OutOfRange);
    expect(toConnectError(original)).toBe(original);
    expect(toConnectError(new DOMException("stop", "AbortError")).code).toBe(Code.Canceled);
    expect(toConnectError(new DOMException("late", "TimeoutError")).code).toBe(Code.DeadlineExceeded);
    const logged: unknown[] = [];
    const logger = { debug() {}, info() {}, warn() {}, error: (fields: Record<string, unknown>) => void logged.push(fields) };
    const hidden = toConnectError(new TypeError("cannot read x of undefined at /home/me/secret"), logger, "/a.B/C");
    expect(hidden.code).toBe(Code.Internal);
    expect(hidden.rawMessage).toBe(INTERNAL_ERROR_MESSAGE);
    expect(logged).toEqual([expect.objectContaining({ method: "/a.B/C" })]);
    expect(toConnectError("a string").code).toBe(Code.Internal);
  });
});

describe("createErrorInterceptor", () => {
  it("maps errors thrown before a response and in the middle of a stream", async () => {
    const transport = createRouterTransport(
      (router) =>
        router.service(Health, {
          check() {
            throw invalidArgument("service", "must be short");
          },
          async *watch() {
            yield { status: 1 };
            throw new BerthError("resource_exhausted", "watcher too slow: resume from seq 41", { resume_from: 41 });
          },
        }),
      { router: { interceptors: [createErrorInterceptor()] } },
    );
    const client = createClient(Health, transport);
    await expect(client.check({})).rejects.toMatchObject({ code: Code.InvalidArgument, rawMessage: "service: must be short" });
    const stream = client.watch({})[Symbol.asyncIterator]();
    expect((await stream.next()).value?.status).toBe(1);
    const error = await stream.next().then(
      () => undefined,
      (e: unknown) => e as ConnectError,
    );
    expect(error?.code).toBe(Code.ResourceExhausted);
    expect(toJson(StructSchema, error!.findDetails(StructSchema)[0]!)).toEqual({ resume_from: 41 });
  });
});
