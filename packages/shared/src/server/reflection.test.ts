import { describe, expect, it } from "vitest";
import { create, createFileRegistry, fromBinary } from "@bufbuild/protobuf";
import {
  FileDescriptorProtoSchema,
  FileDescriptorSetSchema,
  file_google_protobuf_api,
  file_google_protobuf_cpp_features,
  file_google_protobuf_descriptor,
} from "@bufbuild/protobuf/wkt";
import { createClient, createRouterTransport } from "@connectrpc/connect";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import * as v1 from "@berth/api/grpc/reflection/v1/reflection_pb";
import * as v1alpha from "@berth/api/grpc/reflection/v1alpha/reflection_pb";
import { createReflectionV1alphaService, createReflectionV1Service, ReflectionIndex, type ReflectionAnswer } from "./reflection.js";

const index = new ReflectionIndex([Health, v1.ServerReflection, v1alpha.ServerReflection], [file_google_protobuf_api, file_google_protobuf_cpp_features]);

function ask(messageRequest: v1.ServerReflectionRequest["messageRequest"]): ReflectionAnswer {
  return index.answer(create(v1.ServerReflectionRequestSchema, { messageRequest }));
}

function fileNames(answer: ReflectionAnswer): string[] {
  if (answer.case !== "fileDescriptorResponse") throw new Error(`expected files, got ${JSON.stringify(answer)}`);
  return answer.value.fileDescriptorProto.map((bytes) => fromBinary(FileDescriptorProtoSchema, bytes).name);
}

describe("ReflectionIndex", () => {
  it("lists the served services, sorted", () => {
    expect(ask({ case: "listServices", value: "*" })).toEqual({
      case: "listServicesResponse",
      value: {
        service: [{ name: "grpc.health.v1.Health" }, { name: "grpc.reflection.v1.ServerReflection" }, { name: "grpc.reflection.v1alpha.ServerReflection" }],
      },
    });
  });

  it("finds the file of every kind of symbol, nested ones and a leading dot included", () => {
    for (const symbol of [
      "grpc.health.v1.Health",
      "grpc.health.v1.Health.Watch",
      "grpc.health.v1.HealthCheckRequest",
      "grpc.health.v1.HealthCheckRequest.service",
      "grpc.health.v1.HealthCheckResponse.ServingStatus",
      "grpc.health.v1.HealthCheckResponse.SERVING",
      ".grpc.health.v1.HealthCheckResponse",
    ]) {
      expect(fileNames(ask({ case: "fileContainingSymbol", value: symbol })), symbol).toEqual(["grpc/health/v1/health.proto"]);
    }
    expect(fileNames(ask({ case: "fileContainingSymbol", value: "google.protobuf.Method" }))[0]).toBe("google/protobuf/api.proto");
    expect(fileNames(ask({ case: "fileContainingSymbol", value: "google.protobuf.FieldDescriptorProto.Type" }))[0]).toBe("google/protobuf/descriptor.proto");
  });

  it("answers a file with its transitive imports, the file first", () => {
    const names = fileNames(ask({ case: "fileByFilename", value: "google/protobuf/api.proto" }));
    expect(names[0]).toBe("google/protobuf/api.proto");
    expect([...names].sort()).toEqual([
      "google/protobuf/any.proto",
      "google/protobuf/api.proto",
      "google/protobuf/source_context.proto",
      "google/protobuf/type.proto",
    ]);
  });

  it("answers bytes a client can rebuild the whole schema from", () => {
    const answer = ask({ case: "fileContainingSymbol", value: "google.protobuf.Api" });
    if (answer.case !== "fileDescriptorResponse") throw new Error("expected files");
    // The spec promises no order: sort the files so that imports come first, as a client would.
    const pending = answer.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b));
    const sorted: typeof pending = [];
    while (pending.length > 0) {
      const next = pending.findIndex((f) => f.dependency.every((d) => sorted.some((s) => s.name === d)));
      expect(next, "every import is in the answer").toBeGreaterThanOrEqual(0);
      sorted.push(...pending.splice(next, 1));
    }
    const registry = createFileRegistry(create(FileDescriptorSetSchema, { file: sorted }));
    expect(registry.getMessage("google.protobuf.Api")?.field["methods"]?.message?.typeName).toBe("google.protobuf.Method");
  });

  it("finds extensions and their numbers", () => {
    expect(
      fileNames(
        ask({
          case: "fileContainingExtension",
          value: create(v1.ExtensionRequestSchema, { containingType: "google.protobuf.FeatureSet", extensionNumber: 1000 }),
        }),
      )[0],
    ).toBe("google/protobuf/cpp_features.proto");
    expect(ask({ case: "allExtensionNumbersOfType", value: "google.protobuf.FeatureSet" })).toEqual({
      case: "allExtensionNumbersResponse",
      value: { baseTypeName: "google.protobuf.FeatureSet", extensionNumber: [1000] },
    });
    expect(ask({ case: "allExtensionNumbersOfType", value: "grpc.health.v1.HealthCheckRequest" })).toEqual({
      case: "allExtensionNumbersResponse",
      value: { baseTypeName: "grpc.health.v1.HealthCheckRequest", extensionNumber: [] },
    });
  });

  it("answers NOT_FOUND (code 5) for what it does not know, and INVALID_ARGUMENT for an empty request", () => {
    for (const request of [
      { case: "fileByFilename", value: "nope.proto" },
      { case: "fileContainingSymbol", value: "no.Such" },
      { case: "fileContainingExtension", value: create(v1.ExtensionRequestSchema, { containingType: "google.protobuf.FeatureSet", extensionNumber: 5 }) },
      { case: "allExtensionNumbersOfType", value: "no.Such" },
    ] as const) {
      expect(ask(request)).toMatchObject({ case: "errorResponse", value: { errorCode: 5 } });
    }
    expect(ask({ case: undefined })).toMatchObject({ case: "errorResponse", value: { errorCode: 3 } });
  });

  it("indexes a file only once however many services share it", () => {
    const twice = new ReflectionIndex([v1.ServerReflection, v1.ServerReflection], [file_google_protobuf_descriptor, file_google_protobuf_descriptor]);
    expect(twice.listServices()).toEqual(["grpc.reflection.v1.ServerReflection"]);
  });
});

describe("reflection services", () => {
  it("answer each request of the stream in order, echoing host and request, in both versions", async () => {
    const transport = createRouterTransport((router) => {
      router.service(v1.ServerReflection, createReflectionV1Service(index));
      router.service(v1alpha.ServerReflection, createReflectionV1alphaService(index));
    });
    async function* requests() {
      yield { host: "h", messageRequest: { case: "listServices" as const, value: "" } };
      yield { host: "h", messageRequest: { case: "fileContainingSymbol" as const, value: "grpc.health.v1.Health" } };
    }
    const answers: string[] = [];
    for await (const response of createClient(v1.ServerReflection, transport).serverReflectionInfo(requests())) {
      expect(response.validHost).toBe("h");
      answers.push(`${response.originalRequest?.messageRequest.case}->${response.messageResponse.case}`);
    }
    for await (const response of createClient(v1alpha.ServerReflection, transport).serverReflectionInfo(requests())) {
      answers.push(`${response.originalRequest?.messageRequest.case}->${response.messageResponse.case}`);
    }
    expect(answers).toEqual([
      "listServices->listServicesResponse",
      "fileContainingSymbol->fileDescriptorResponse",
      "listServices->listServicesResponse",
      "fileContainingSymbol->fileDescriptorResponse",
    ]);
  });
});
