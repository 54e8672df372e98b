import { describe, expect, it } from "vitest";
import { create, createFileRegistry, toJson, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_struct, StructSchema, ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { createGrpcTransport } from "@connectrpc/connect-node";
import pino from "pino";
import { implement, startServer } from "./start-server.js";
import { BerthError, invalidArgument, type BerthCode } from "../errors.js";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import {
  connectCodeOf,
  createErrorInterceptor,
  ERROR_DETAILS_HEADER,
  INTERNAL_ERROR_MESSAGE,
  MAX_ERROR_MESSAGE_CHARS,
  toConnectError,
} from "./connect-errors.js";

describe("toConnectError", () => {
  it("maps every domain code to the Connect code of the same name", () => {
    const codes: Record<BerthCode, Code> = {
      invalid_argument: Code.InvalidArgument,
      not_found: Code.NotFound,
      already_exists: Code.AlreadyExists,
      failed_precondition: Code.FailedPrecondition,
      aborted: Code.Aborted,
      out_of_range: Code.OutOfRange,
      resource_exhausted: Code.ResourceExhausted,
      unimplemented: Code.Unimplemented,
      unavailable: Code.Unavailable,
      unauthenticated: Code.Unauthenticated,
      deadline_exceeded: Code.DeadlineExceeded,
      cancelled: Code.Canceled,
      internal: Code.Internal,
    };
    for (const [berth, connect] of Object.entries(codes)) expect(connectCodeOf(berth as BerthCode)).toBe(connect);
  });

  it("keeps the message and carries details as a Struct and an ASCII JSON header with the reason", () => {
    const error = toConnectError(
      new BerthError("aborted", "lock held by build-7 since 12:00", { holder: "build-7", seq: 10n, nested: { ok: true }, skip: undefined, name: "ünï" }),
    );
    expect(error.code).toBe(Code.Aborted);
    expect(error.rawMessage).toBe("lock held by build-7 since 12:00");
    expect(toJson(StructSchema, error.findDetails(StructSchema)[0]!)).toEqual({ holder: "build-7", seq: "10", nested: { ok: true }, name: "ünï" });
    const header = error.metadata.get(ERROR_DETAILS_HEADER)!;
    expect(header).toMatch(/^[\x20-\x7e]+$/);
    expect(JSON.parse(header)).toEqual({ reason: "ABORTED", holder: "build-7", seq: "10", nested: { ok: true }, name: "ünï" });
  });

  it("names every error's case in an ErrorInfo of the method's service, with its details as string metadata", () => {
    const error = toConnectError(
      new BerthError("aborted", "seq moved", { sessionId: "s1", currentSeq: 7n, expected: { seq: 5 } }, { reason: "SEQ_CONFLICT" }),
      undefined,
      "/berth.sessions.v1.SessionService/AppendEvent",
    );
    const [info] = error.findDetails(ErrorInfoSchema);
    expect(info).toMatchObject({ reason: "SEQ_CONFLICT", domain: "berth.sessions", metadata: { sessionId: "s1", currentSeq: "7", expected: '{"seq":5}' } });
    expect(error.findDetails(RetryInfoSchema)).toEqual([]);
    const plain = toConnectError(new BerthError("not_found", "no session abc"), undefined, "/berth.locks.v1.LockService/Inspect");
    expect(plain.findDetails(ErrorInfoSchema)).toEqual([expect.objectContaining({ reason: "NOT_FOUND", domain: "berth.locks" })]);
    expect(JSON.parse(plain.metadata.get(ERROR_DETAILS_HEADER)!)).toEqual({ reason: "NOT_FOUND" });
  });

  it("adds a RetryInfo when a retry can succeed, and a BadRequest naming the field of an INVALID_ARGUMENT", () => {
    const overtaken = toConnectError(new BerthError("unavailable", "overtaken", undefined, { reason: "APPEND_OVERTAKEN", retryAfterMs: 250 }));
    expect(overtaken.findDetails(RetryInfoSchema)[0]?.retryDelay).toMatchObject({ seconds: 0n, nanos: 250_000_000 });
    const bad = toConnectError(invalidArgument("session_id", "must match [A-Za-z0-9_-]{1,128}"));
    expect(bad.findDetails(ErrorInfoSchema)[0]?.reason).toBe("INVALID_FIELD");
    expect(bad.findDetails(BadRequestSchema)[0]?.fieldViolations).toEqual([
      expect.objectContaining({ field: "session_id", description: "must match [A-Za-z0-9_-]{1,128}", reason: "INVALID_FIELD" }),
    ]);
  });

  it("gives errors raised outside berth's code the reason of their code, and UNAVAILABLE a retry delay", () => {
    const shutdown = toConnectError(new ConnectError("server shutting down", Code.Unavailable), undefined, "/berth.budget.v1.BudgetService/Admit");
    expect(shutdown.findDetails(ErrorInfoSchema)[0]).toMatchObject({ reason: "SHUTTING_DOWN", domain: "berth.budget" });
    expect(shutdown.findDetails(RetryInfoSchema)).toHaveLength(1);
    expect(toConnectError(new ConnectError("x", Code.OutOfRange)).findDetails(ErrorInfoSchema)[0]?.reason).toBe("OUT_OF_RANGE");
    expect(toConnectError(new ConnectError("x", Code.DeadlineExceeded)).findDetails(ErrorInfoSchema)[0]?.reason).toBe("DEADLINE_EXCEEDED");
  });

  it("passes ConnectErrors through, maps aborts, hides everything else behind INTERNAL and logs it", () => {
    const original = new ConnectError("x", Code.OutOfRange);
    const passed = toConnectError(original);
    expect([passed.code, passed.rawMessage]).toEqual([Code.OutOfRange, "x"]);
    const named = toConnectError(passed);
    expect(named).toBe(passed);
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

// Found by the fuzzer (test/chaos/fuzz/fuzz.test.ts). A rule quoting a 1 MB input made a 1 MB gRPC
// trailer, which HTTP/2 cannot carry: the client saw the stream reset (FRAME_SIZE_ERROR) instead of
// INVALID_ARGUMENT. And a client that reset its stream while a handler read it was logged as
// "handler failed unexpectedly" and counted INTERNAL.
describe("what errors carry to the wire", () => {
  it("cuts an overlong message and overlong detail strings, and replaces lone surrogates", () => {
    const huge = "a".repeat(1 << 20);
    const error = toConnectError(invalidArgument("spec.memory", `must be a size like 512M; got ${JSON.stringify(huge)}`));
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage.length).toBeLessThan(MAX_ERROR_MESSAGE_CHARS + 40);
    expect(error.rawMessage).toMatch(/^spec\.memory: must be a size like 512M; got "aaa.*… \(\d+ more characters\)$/);
    const header = error.metadata.get(ERROR_DETAILS_HEADER)!;
    expect(header.length).toBeLessThan(1024);
    expect(JSON.parse(header)).toMatchObject({ field: "spec.memory" });
    expect(() => encodeURIComponent(toConnectError(new BerthError("invalid_argument", "id: got \ud800")).rawMessage)).not.toThrow();
    const long = toConnectError(new ConnectError("b".repeat(100_000), Code.NotFound));
    expect(long.code).toBe(Code.NotFound);
    expect(long.rawMessage.length).toBeLessThan(MAX_ERROR_MESSAGE_CHARS + 40);
  });

  it("treats a client that hung up mid-call as CANCELED, without an error log", () => {
    const logged: unknown[] = [];
    const logger = { debug() {}, info() {}, warn() {}, error: (fields: Record<string, unknown>) => void logged.push(fields) };
    const premature = Object.assign(new Error("Premature close"), { code: "ERR_STREAM_PREMATURE_CLOSE" });
    expect(toConnectError(premature, logger, "/a.B/C").code).toBe(Code.Canceled);
    expect(toConnectError(Object.assign(new Error("aborted"), { code: "ECONNRESET" }), logger).code).toBe(Code.Canceled);
    expect(logged).toEqual([]);
  });

  it("delivers a refusal quoting a huge input to a gRPC client as its status", async () => {
    const registry = createFileRegistry(
      create(FileDescriptorProtoSchema, {
        name: "berth/test/v1/quote.proto",
        package: "berth.test.v1",
        dependency: ["google/protobuf/struct.proto"],
        syntax: "proto3",
        service: [{ name: "QuoteService", method: [{ name: "Refuse", inputType: ".google.protobuf.Value", outputType: ".google.protobuf.Value" }] }],
      }),
      (name) => (name === "google/protobuf/struct.proto" ? file_google_protobuf_struct : undefined),
    );
    const QuoteService = registry.getService("berth.test.v1.QuoteService") as DescService;
    const server = await startServer({
      name: "test",
      logger: pino({ level: "silent" }),
      services: [
        implement(QuoteService, {
          refuse(request: Value) {
            throw invalidArgument("value", `unknown; got ${JSON.stringify(toJson(ValueSchema, request))}`);
          },
        } as never),
      ],
    });
    try {
      const client = createClient(QuoteService, createGrpcTransport({ baseUrl: server.url })) as unknown as { refuse(value: Value): Promise<Value> };
      const huge = create(ValueSchema, { kind: { case: "stringValue", value: "x".repeat(1 << 20) } });
      await expect(client.refuse(huge)).rejects.toMatchObject({ code: Code.InvalidArgument, rawMessage: expect.stringMatching(/^value: unknown; got "xxx/) });
    } finally {
      await server.close(false);
    }
  });
});
