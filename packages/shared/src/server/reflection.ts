/**
 * gRPC server reflection, `grpc.reflection.v1` and `grpc.reflection.v1alpha` (the two differ only
 * in package name; older clients speak only v1alpha). Answers come from the file descriptors
 * embedded in the generated code, so a client such as `buf curl` or grpcurl can call any RPC knowing
 * nothing but what the server tells it.
 */
import { create, toBinary, type DescEnum, type DescExtension, type DescFile, type DescMessage, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, type ServiceImpl } from "@connectrpc/connect";
import * as v1 from "@berth/api/grpc/reflection/v1/reflection_pb";
import * as v1alpha from "@berth/api/grpc/reflection/v1alpha/reflection_pb";
import { abortable } from "./streams.js";

/** The request of either reflection version, as far as answering it goes. */
type ReflectionRequest = v1.ServerReflectionRequest | v1alpha.ServerReflectionRequest;

/** The answer to one reflection request, shaped so that both versions' response messages accept it. */
export type ReflectionAnswer =
  | { case: "fileDescriptorResponse"; value: { fileDescriptorProto: Uint8Array[] } }
  | { case: "allExtensionNumbersResponse"; value: { baseTypeName: string; extensionNumber: number[] } }
  | { case: "listServicesResponse"; value: { service: Array<{ name: string }> } }
  | { case: "errorResponse"; value: { errorCode: number; errorMessage: string } };

/**
 * What the server can describe: the services it serves and every file (with its transitive
 * imports, the well-known types included) that declares them or was added explicitly.
 */
export class ReflectionIndex {
  private readonly serviceNames: string[];
  private readonly filesByName = new Map<string, DescFile>();
  private readonly filesBySymbol = new Map<string, DescFile>();
  /** extendee type name → extension number → the file declaring the extension */
  private readonly extensions = new Map<string, Map<number, DescFile>>();
  private readonly messageNames = new Set<string>();
  private readonly encoded = new Map<DescFile, Uint8Array>();

  constructor(services: readonly DescService[], files: readonly DescFile[] = []) {
    this.serviceNames = [...new Set(services.map((s) => s.typeName))].sort();
    for (const file of [...services.map((s) => s.file), ...files]) this.addFile(file);
  }

  /** The full names of the served services, sorted. */
  listServices(): readonly string[] {
    return this.serviceNames;
  }

  /** Answers one request of the reflection stream. */
  answer(request: ReflectionRequest): ReflectionAnswer {
    const query = request.messageRequest;
    switch (query.case) {
      case "listServices":
        return { case: "listServicesResponse", value: { service: this.serviceNames.map((name) => ({ name })) } };
      case "fileByFilename":
        return this.fileAnswer(this.filesByName.get(query.value), `file ${JSON.stringify(query.value)}`);
      case "fileContainingSymbol":
        return this.fileAnswer(this.filesBySymbol.get(stripDot(query.value)), `symbol ${JSON.stringify(query.value)}`);
      case "fileContainingExtension": {
        const { containingType, extensionNumber } = query.value;
        const file = this.extensions.get(stripDot(containingType))?.get(extensionNumber);
        return this.fileAnswer(file, `extension ${extensionNumber} of ${JSON.stringify(containingType)}`);
      }
      case "allExtensionNumbersOfType": {
        const type = stripDot(query.value);
        if (!this.messageNames.has(type)) return notFound(`message type ${JSON.stringify(query.value)}`);
        const numbers = [...(this.extensions.get(type)?.keys() ?? [])].sort((a, b) => a - b);
        return { case: "allExtensionNumbersResponse", value: { baseTypeName: type, extensionNumber: numbers } };
      }
      case undefined:
        return {
          case: "errorResponse",
          value: {
            errorCode: Code.InvalidArgument,
            errorMessage:
              "the request sets none of list_services, file_by_filename, file_containing_symbol, file_containing_extension, all_extension_numbers_of_type",
          },
        };
    }
  }

  /**
   * The file first, then its transitive imports. Every answer carries the whole closure (the
   * spec lets a server skip files sent earlier on the stream, but not every client copes).
   */
  private fileAnswer(file: DescFile | undefined, what: string): ReflectionAnswer {
    if (file === undefined) return notFound(what);
    const closure: DescFile[] = [];
    const seen = new Set<DescFile>();
    const visit = (f: DescFile) => {
      if (seen.has(f)) return;
      seen.add(f);
      closure.push(f);
      for (const dependency of f.dependencies) visit(dependency);
    };
    visit(file);
    return { case: "fileDescriptorResponse", value: { fileDescriptorProto: closure.map((f) => this.encode(f)) } };
  }

  private encode(file: DescFile): Uint8Array {
    let bytes = this.encoded.get(file);
    if (bytes === undefined) {
      bytes = toBinary(FileDescriptorProtoSchema, file.proto);
      this.encoded.set(file, bytes);
    }
    return bytes;
  }

  private addFile(file: DescFile): void {
    const fileName = file.proto.name;
    if (this.filesByName.has(fileName)) return;
    this.filesByName.set(fileName, file);
    for (const dependency of file.dependencies) this.addFile(dependency);

    const packagePrefix = file.proto.package === "" ? "" : `${file.proto.package}.`;
    for (const service of file.services) {
      this.symbol(service.typeName, file);
      for (const method of service.methods) this.symbol(`${service.typeName}.${method.name}`, file);
    }
    for (const message of file.messages) this.addMessage(message, file);
    for (const enumeration of file.enums) this.addEnum(enumeration, packagePrefix, file);
    for (const extension of file.extensions) this.addExtension(extension, file);
  }

  private addMessage(message: DescMessage, file: DescFile): void {
    this.symbol(message.typeName, file);
    this.messageNames.add(message.typeName);
    for (const field of message.fields) this.symbol(`${message.typeName}.${field.name}`, file);
    for (const oneof of message.oneofs) this.symbol(`${message.typeName}.${oneof.name}`, file);
    for (const nested of message.nestedMessages) this.addMessage(nested, file);
    for (const nested of message.nestedEnums) this.addEnum(nested, `${message.typeName}.`, file);
    for (const extension of message.nestedExtensions) this.addExtension(extension, file);
  }

  /** Enum values are scoped beside their enum, not inside it (protobuf's C++ scoping rule). */
  private addEnum(enumeration: DescEnum, scopePrefix: string, file: DescFile): void {
    this.symbol(enumeration.typeName, file);
    for (const value of enumeration.values) this.symbol(`${scopePrefix}${value.name}`, file);
  }

  private addExtension(extension: DescExtension, file: DescFile): void {
    this.symbol(extension.typeName, file);
    let byNumber = this.extensions.get(extension.extendee.typeName);
    if (byNumber === undefined) {
      byNumber = new Map();
      this.extensions.set(extension.extendee.typeName, byNumber);
    }
    byNumber.set(extension.number, file);
  }

  private symbol(name: string, file: DescFile): void {
    if (!this.filesBySymbol.has(name)) this.filesBySymbol.set(name, file);
  }
}

function notFound(what: string): ReflectionAnswer {
  return { case: "errorResponse", value: { errorCode: Code.NotFound, errorMessage: `${what} not found` } };
}

/** Clients may send a fully-qualified name with protobuf's leading dot. */
function stripDot(name: string): string {
  return name.startsWith(".") ? name.slice(1) : name;
}

/** `grpc.reflection.v1.ServerReflection` over an index. */
export function createReflectionV1Service(index: ReflectionIndex): ServiceImpl<typeof v1.ServerReflection> {
  return {
    async *serverReflectionInfo(requests, context) {
      for await (const request of abortable(requests, context.signal)) {
        yield create(v1.ServerReflectionResponseSchema, {
          validHost: request.host,
          originalRequest: request,
          messageResponse: index.answer(request),
        });
      }
    },
  };
}

/** `grpc.reflection.v1alpha.ServerReflection` over an index. */
export function createReflectionV1alphaService(index: ReflectionIndex): ServiceImpl<typeof v1alpha.ServerReflection> {
  return {
    async *serverReflectionInfo(requests, context) {
      for await (const request of abortable(requests, context.signal)) {
        yield create(v1alpha.ServerReflectionResponseSchema, {
          validHost: request.host,
          originalRequest: request,
          messageResponse: index.answer(request),
        });
      }
    },
  };
}

/** The reflection services, both versions. */
export const reflectionServices: readonly DescService[] = [v1.ServerReflection, v1alpha.ServerReflection];
