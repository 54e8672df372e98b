/**
 * How the security suite probes a server: any method of any service called by its descriptor on
 * every wire (grpc-js, connect-node's gRPC, Connect, gRPC-Web) with chosen headers, the services a
 * server publishes by its own reflection against those the API defines, and the entries of a state
 * directory with their modes.
 */
import { lstatSync, readdirSync } from "node:fs";
import * as path from "node:path";
import {
  create,
  fromBinary,
  type DescMethod,
  type DescMethodBiDiStreaming,
  type DescMethodServerStreaming,
  type DescMethodUnary,
  type DescService,
  type FileRegistry,
  createFileRegistry,
} from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, type FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { ConnectError, type Client } from "@connectrpc/connect";
import { ServerReflection } from "@berth/api/grpc/reflection/v1/reflection_pb";
import { pushable } from "@berth/budget/server/testing";
import { closeClient, connectClient, grpcCodeName, grpcJsClient, repoPath, type ConnectClientOptions } from "../../harness.js";

/** How long any one refused call may take: a refusal is immediate, this only catches hangs. */
const CALL_DEADLINE_MS = 20_000;
/** With the token, streams that would run on are cut after their first message or this long. */
const ADMITTED_STREAM_MS = 3_000;

// ---------------------------------------------------------------------------------------------
// Calling any method of any service, by its descriptor
// ---------------------------------------------------------------------------------------------

/** How a call ended: a gRPC status name, or RECEIVED when a stream yielded a message (then cut). */
export interface Outcome {
  readonly code: string;
  readonly messages: number;
}

/** The wires a call can take. */
export type Wire = "grpc-js" | "connect-node grpc" | "connect" | "grpc-web";
export const WIRES: readonly Wire[] = ["grpc-js", "connect-node grpc", "connect", "grpc-web"];

/** Clients of one server by wire and service, made once and closed with the test. */
export class Callers {
  private readonly connect = new Map<string, Client<DescService>>();
  private readonly grpcJs;
  constructor(private readonly url: string) {
    this.grpcJs = grpcJsClient(url);
  }

  /** Calls `method` with an empty request (one empty message for client streams) on `wire`. */
  async call(wire: Wire, method: DescMethod, headers: Record<string, string>, stopAfterFirst: boolean): Promise<Outcome> {
    const deadlineMs = stopAfterFirst ? ADMITTED_STREAM_MS : CALL_DEADLINE_MS;
    if (wire === "grpc-js") return this.callGrpcJs(method, headers, stopAfterFirst, deadlineMs);
    return this.callConnect(wire, method, headers, stopAfterFirst, deadlineMs);
  }

  private async callGrpcJs(method: DescMethod, metadata: Record<string, string>, stopAfterFirst: boolean, deadlineMs: number): Promise<Outcome> {
    const options = { metadata, deadlineMs };
    switch (method.methodKind) {
      case "unary":
        try {
          await this.grpcJs.unary(method as DescMethodUnary, {}, options);
          return { code: "OK", messages: 1 };
        } catch (error) {
          return { code: grpcCodeName((error as { code: number }).code), messages: 0 };
        }
      case "server_streaming":
        return streamOutcome(this.grpcJs.serverStream(method as DescMethodServerStreaming, {}, options), stopAfterFirst);
      case "bidi_streaming":
      case "client_streaming": {
        // grpc-js's bidi call carries client streams too: the framing is the same on the wire.
        const call = this.grpcJs.bidi(method as unknown as DescMethodBiDiStreaming, options);
        const outcome = streamOutcome(call, stopAfterFirst);
        call.write({});
        call.end();
        return outcome;
      }
    }
  }

  private async callConnect(
    wire: Exclude<Wire, "grpc-js">,
    method: DescMethod,
    headers: Record<string, string>,
    stopAfterFirst: boolean,
    timeoutMs: number,
  ): Promise<Outcome> {
    const client = this.connectFor(wire, method) as unknown as Record<string, (input: unknown, options: object) => unknown>;
    const call = client[method.localName]!;
    const options = { headers, timeoutMs };
    let messages = 0;
    try {
      switch (method.methodKind) {
        case "unary":
          await (call(create(method.input), options) as Promise<unknown>);
          return { code: "OK", messages: 1 };
        case "client_streaming":
          await (call(oneMessage(method), options) as Promise<unknown>);
          return { code: "OK", messages: 1 };
        case "server_streaming":
        case "bidi_streaming": {
          const input = method.methodKind === "server_streaming" ? create(method.input) : oneMessage(method);
          for await (const _ of call(input, options) as AsyncIterable<unknown>) {
            messages++;
            if (stopAfterFirst) return { code: "RECEIVED", messages };
          }
          return { code: "OK", messages };
        }
      }
    } catch (error) {
      return { code: grpcCodeName(ConnectError.from(error).code), messages };
    }
  }

  /** Connect and gRPC-Web over HTTP/1.1 (JSON for Connect), except bidi streams, which need HTTP/2. */
  private connectFor(wire: Exclude<Wire, "grpc-js">, method: DescMethod): Client<DescService> {
    const bidi = method.methodKind === "bidi_streaming";
    const key = `${wire}|${bidi}|${method.parent.typeName}`;
    let client = this.connect.get(key);
    if (client === undefined) {
      const options: ConnectClientOptions =
        wire === "connect-node grpc"
          ? { protocol: "grpc" }
          : wire === "connect"
            ? bidi
              ? { protocol: "connect", httpVersion: "2" }
              : { protocol: "connect", httpVersion: "1.1", useBinaryFormat: false }
            : { protocol: "grpc-web", httpVersion: bidi ? "2" : "1.1" };
      client = connectClient(method.parent, this.url, { ...options, defaultTimeoutMs: CALL_DEADLINE_MS });
      this.connect.set(key, client);
    }
    return client;
  }

  close(): void {
    this.grpcJs.close();
    for (const client of this.connect.values()) closeClient(client);
  }
}

async function* oneMessage(method: DescMethod): AsyncGenerator<unknown> {
  yield create(method.input);
}

/** Follows a grpc-js stream to its status; with `stopAfterFirst`, cancels it at its first message. */
function streamOutcome(call: NodeJS.EventEmitter & { cancel(): void }, stopAfterFirst: boolean): Promise<Outcome> {
  return new Promise((resolve) => {
    let messages = 0;
    let received = false;
    call.on("data", () => {
      messages++;
      if (stopAfterFirst && !received) {
        received = true;
        call.cancel();
      }
    });
    call.on("error", () => {}); // the status event below carries the code
    call.on("status", (status: { code: number }) => resolve({ code: received ? "RECEIVED" : grpcCodeName(status.code), messages }));
  });
}

/** Runs `tasks` with at most `limit` at once. */
export async function inBatches<T>(tasks: ReadonlyArray<() => Promise<T>>, limit: number): Promise<T[]> {
  const results: T[] = new Array(tasks.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, tasks.length) }, async () => {
      while (next < tasks.length) {
        const index = next++;
        results[index] = await tasks[index]!();
      }
    }),
  );
  return results;
}

// ---------------------------------------------------------------------------------------------
// The services a server publishes, from its own reflection
// ---------------------------------------------------------------------------------------------

/**
 * The services `url` serves, as DescServices built from the FileDescriptorProtos its reflection
 * returns (asked with `token`): what the server really exposes, not what this test imports.
 */
export async function servedServices(url: string, token: string): Promise<DescService[]> {
  const reflection = connectClient(ServerReflection, url, { protocol: "grpc", token });
  const requests = pushable<{ messageRequest: { case: "listServices"; value: string } | { case: "fileContainingSymbol"; value: string } }>();
  const responses = reflection.serverReflectionInfo(requests)[Symbol.asyncIterator]();
  const ask = async (request: Parameters<typeof requests.push>[0]) => {
    requests.push(request);
    const next = await responses.next();
    if (next.done) throw new Error(`reflection at ${url} ended the stream`);
    return next.value.messageResponse;
  };
  try {
    const listed = await ask({ messageRequest: { case: "listServices", value: "" } });
    if (listed.case !== "listServicesResponse") throw new Error(`reflection at ${url}: list_services answered ${listed.case}`);
    const files = new Map<string, FileDescriptorProto>();
    const serviceFile = new Map<string, string>();
    for (const { name } of listed.value.service) {
      const answer = await ask({ messageRequest: { case: "fileContainingSymbol", value: name } });
      if (answer.case !== "fileDescriptorResponse") throw new Error(`reflection at ${url}: ${name} answered ${answer.case}`);
      const protos = answer.value.fileDescriptorProto.map((bytes) => fromBinary(FileDescriptorProtoSchema, bytes));
      for (const proto of protos) files.set(proto.name, proto);
      // The first file is the one that defines the symbol; the rest are its dependencies.
      serviceFile.set(name, protos[0]!.name);
    }
    const registries = new Map<string, FileRegistry>();
    return [...serviceFile].map(([name, file]) => {
      let registry = registries.get(file);
      if (registry === undefined) {
        registry = createFileRegistry(files.get(file)!, (dependency) => files.get(dependency));
        registries.set(file, registry);
      }
      const service = registry.getService(name);
      if (service === undefined) throw new Error(`reflection at ${url}: ${file} does not define ${name}`);
      return service;
    });
  } finally {
    requests.end();
    closeClient(reflection);
  }
}

/** Every service defined in the generated `@berth/api` package (its `*_pb` modules' exports). */
export async function generatedServices(): Promise<string[]> {
  const root = repoPath("packages/api/src");
  const modules: string[] = [];
  const walk = (dir: string) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) walk(full);
      else if (entry.name.endsWith("_pb.ts")) modules.push(full);
    }
  };
  walk(root);
  const names = new Set<string>();
  for (const module of modules) {
    const exports = (await import(module)) as Record<string, unknown>;
    for (const value of Object.values(exports)) {
      if (typeof value === "object" && value !== null && (value as { kind?: unknown }).kind === "service") names.add((value as DescService).typeName);
    }
  }
  return [...names].sort();
}

// ---------------------------------------------------------------------------------------------
// The state directory
// ---------------------------------------------------------------------------------------------

export interface StateEntry {
  readonly relative: string;
  readonly kind: "file" | "dir" | "socket" | "other";
  readonly mode: number;
}

export function walkState(root: string): StateEntry[] {
  const entries: StateEntry[] = [{ relative: ".", kind: "dir", mode: lstatSync(root).mode & 0o777 }];
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const full = path.join(dir, name);
      let stat;
      try {
        stat = lstatSync(full);
      } catch {
        continue; // a temp file renamed away while we looked
      }
      const kind = stat.isDirectory() ? "dir" : stat.isFile() ? "file" : stat.isSocket() ? "socket" : "other";
      entries.push({ relative: path.relative(root, full), kind, mode: stat.mode & 0o777 });
      if (kind === "dir") walk(full);
    }
  };
  walk(root);
  return entries;
}

export function octal(mode: number): string {
  return mode.toString(8).padStart(3, "0");
}

/** What kind of state a file is, by where berth keeps it (for the summary and the coverage check). */
export function categoryOf(relative: string): string {
  const base = path.basename(relative);
  if (relative.startsWith(`sessions${path.sep}`) && base.endsWith(".jsonl")) return "journal";
  if (base.endsWith(".snapshot.json")) return "snapshot";
  if (base.endsWith(".snapshot.meta.json")) return "snapshot-meta";
  if (relative === "sessions.lock" || relative === "budget.lock") return "election";
  if (base === "fencing.json") return "fencing";
  if (relative.startsWith(`budget${path.sep}`) && base.startsWith("running")) return "running-tally";
  if (relative.startsWith(`locks${path.sep}`) || relative.includes(`${path.sep}locks${path.sep}`)) return "source-lock";
  return "other";
}
