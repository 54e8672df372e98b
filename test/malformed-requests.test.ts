/**
 * The same malformed input gets the same answer over every protocol: gRPC, gRPC-Web, Connect with
 * protobuf binary and Connect with JSON, over HTTP/1.1 and HTTP/2 where each runs. Each case is one
 * input written in each protocol's own form (protobuf bytes or their JSON twin, a body or
 * envelopes, the protocol's encoding header), sent by a raw client against the real services (the
 * sessions service on both stores, the budget service, both with a token), and must get the case's
 * code and ErrorInfo reason (in the service's domain) on every route. Then the services must still
 * serve a good request on each protocol.
 */
import { brotliCompressSync, gzipSync } from "node:zlib";
import { create, toBinary, type DescMessage, type MessageInitShape } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BudgetService, CheckRequestSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { AcquireRequestSchema, HoldRequestSchema, KeepAliveRequestSchema, WatchLocksRequestSchema } from "@berth/api/berth/locks/v1/lock_service_pb";
import {
  GetSnapshotRequestSchema,
  ReadJournalRequestSchema,
  SessionService,
  WatchSessionRequestSchema,
  WatchSessionsRequestSchema,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { envelope, isJsonProtocol, RAW_ROUTES, rawRpc, type RawProtocol, type RawRpcRequest } from "@berth/shared/server/testing/raw-rpc";
import { startBudget } from "./budget-e2e.js";
import { connectClient, onStore, STORES, startService, stopAll, storeTags, PROTOCOLS } from "./harness.js";

afterAll(stopAll);

const TOKEN = "parity-token";

/** Protobuf wire bytes, by hand: what no encoder would write. */
const wire = {
  varint(value: bigint | number): number[] {
    let v = BigInt(value);
    const out: number[] = [];
    do {
      const byte = Number(v & 0x7fn);
      v >>= 7n;
      out.push(v > 0n ? byte | 0x80 : byte);
    } while (v > 0n);
    return out;
  },
  tag: (field: number, type: number) => wire.varint((field << 3) | type),
  /** A length-delimited field. */
  bytes: (field: number, payload: ArrayLike<number>) => [...wire.tag(field, 2), ...wire.varint(payload.length), ...Array.from(payload)],
};

const bin = (...parts: ArrayLike<number>[]) => Uint8Array.from(parts.flatMap((p) => Array.from(p)));
const text = (...parts: Array<string | number[]>) => Buffer.concat(parts.map((p) => (typeof p === "string" ? Buffer.from(p, "utf8") : Buffer.from(p))));
const encode = <S extends DescMessage>(schema: S, init: MessageInitShape<S>) => toBinary(schema, create(schema, init));

const SESSIONS = "/berth.sessions.v1.SessionService";
const LOCKS = "/berth.locks.v1.LockService";
const BUDGET = "/berth.budget.v1.BudgetService";

/** One input, written in each protocol's form. */
interface Case {
  readonly name: string;
  readonly path: string;
  /** The method streams: Connect frames its messages in envelopes too. */
  readonly streaming?: boolean;
  /** The request messages in protobuf binary, and the same in JSON. */
  readonly binary?: readonly Uint8Array[];
  readonly json?: readonly Uint8Array[];
  /** The body as sent, from the protocol's message bytes (an envelope cut short, compressed bytes). */
  readonly body?: (message: Uint8Array, framing: "body" | "envelope") => Uint8Array;
  /** Headers by framing (an encoding is declared in `grpc-encoding`, `content-encoding` or `connect-content-encoding`). */
  readonly headers?: (protocol: RawProtocol, framing: "body" | "envelope") => Record<string, string | null>;
  /** Default the service's token; null sends none. */
  readonly token?: string | null;
  /** The code and reason on every route, or `http_<status>` for an answer with no RPC status. */
  readonly expect: readonly [code: string, reason?: string];
}

/** The header that declares a compression on each framing. */
function encodingHeader(protocol: RawProtocol, framing: "body" | "envelope", encoding: string): Record<string, string> {
  if (protocol === "grpc" || protocol === "grpc-web") return { "grpc-encoding": encoding };
  return framing === "body" ? { "content-encoding": encoding } : { "connect-content-encoding": encoding };
}

/** A message compressed by `compress` and declared as `encoding`: the compressed flag on an envelope, the body itself otherwise. */
function compressedWith(compress: (bytes: Uint8Array) => Uint8Array, encoding: string): Pick<Case, "body" | "headers"> {
  return {
    body: (message, framing) => (framing === "envelope" ? envelope(1, compress(message)) : compress(message)),
    headers: (protocol, framing) => encodingHeader(protocol, framing, encoding),
  };
}

const snapshotOf = (sessionId: string) => ({ binary: [encode(GetSnapshotRequestSchema, { sessionId })], json: [text(JSON.stringify({ sessionId }))] });
/** A deadline in `protocol`'s header: gRPC's and gRPC-Web's `grpc-timeout`, Connect's `connect-timeout-ms`. */
const deadlineHeader =
  (grpcTimeout: string, connectTimeoutMs: string) =>
  (protocol: RawProtocol): Record<string, string> =>
    protocol === "grpc" || protocol === "grpc-web" ? { "grpc-timeout": grpcTimeout } : { "connect-timeout-ms": connectTimeoutMs };
/** A deadline of 0: passed before the call begins (connect aborts the handler's signal before it runs). */
const deadlinePassed = deadlineHeader("0m", "0");
const readJournal = { binary: [encode(ReadJournalRequestSchema, { sessionId: "s1" })], json: [text('{"sessionId":"s1"}')] };
const FIVE_MB = 5 * 1024 * 1024;
const CESU_SURROGATE = [0xed, 0xa0, 0x80]; // U+D800 written as if it were a character: not UTF-8

const SESSION_CASES: readonly Case[] = [
  {
    name: "a truncated message",
    path: `${SESSIONS}/GetSnapshot`,
    binary: [bin(wire.tag(1, 2), [0x7f, 0x61])],
    json: [text('{"sessionId":"a')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "bytes that are not a message at all",
    path: `${SESSIONS}/GetSnapshot`,
    binary: [bin([0xff, 0xff, 0xff])],
    json: [text("not json")],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "invalid UTF-8 in a string",
    path: `${SESSIONS}/GetSnapshot`,
    binary: [bin(wire.bytes(1, [0x61, 0xff, 0xfe]))],
    json: [text('{"sessionId":"a', [0xff, 0xfe], '"}')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "invalid UTF-8 in a nested string",
    path: `${SESSIONS}/AppendEvent`,
    binary: [bin(wire.bytes(1, Buffer.from("s1")), wire.bytes(2, wire.bytes(1, wire.bytes(1, [0xc3, 0x28]))))],
    json: [text('{"sessionId":"s1","event":{"generate":{"pageUrl":"', [0xc3, 0x28], '"}}}')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "a lone surrogate in a string",
    path: `${SESSIONS}/GetSnapshot`,
    binary: [bin(wire.bytes(1, CESU_SURROGATE))],
    json: [text('{"sessionId":"\\ud800"}')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "a lone surrogate in a Struct",
    path: `${SESSIONS}/AppendEvent`,
    // event.generate.extra = {"note": <U+D800>}: Struct.fields["note"] = Value{string_value}.
    binary: [
      bin(
        wire.bytes(1, Buffer.from("s1")),
        wire.bytes(2, wire.bytes(1, wire.bytes(15, wire.bytes(1, [...wire.bytes(1, Buffer.from("note")), ...wire.bytes(2, wire.bytes(3, CESU_SURROGATE))])))),
      ),
    ],
    json: [text('{"sessionId":"s1","event":{"generate":{"extra":{"note":"\\ud800"}}}}')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "a number where a string belongs",
    path: `${SESSIONS}/GetSnapshot`,
    binary: [bin(wire.tag(1, 0), wire.varint(150))],
    json: [text('{"sessionId":150}')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "a 64-bit number that overflows",
    path: `${SESSIONS}/ReadJournal`,
    streaming: true,
    binary: [bin(wire.bytes(1, Buffer.from("s1")), wire.tag(2, 0), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])],
    json: [text('{"sessionId":"s1","fromSeq":"99999999999999999999"}')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "an unknown field",
    path: `${SESSIONS}/GetSnapshot`,
    binary: [bin(wire.bytes(1, Buffer.from("s1")), wire.tag(999, 0), [1])],
    json: [text('{"sessionId":"s1","bogus":1}')],
    expect: ["invalid_argument", "UNKNOWN_FIELD"],
  },
  {
    name: "a misspelled field (a check the caller asked for would be ignored)",
    path: `${SESSIONS}/AppendEvent`,
    binary: [bin(wire.bytes(1, Buffer.from("s1")), wire.bytes(2, wire.bytes(13, [])), wire.tag(40, 0), [3])],
    json: [text('{"sessionId":"s1","event":{"steer":{}},"expectedSequence":"3"}')],
    expect: ["invalid_argument", "UNKNOWN_FIELD"],
  },
  {
    name: "an unknown field in a stream's request",
    path: `${SESSIONS}/WatchSession`,
    streaming: true,
    binary: [bin(wire.bytes(1, Buffer.from("s1")), wire.tag(77, 0), [1])],
    json: [text('{"sessionId":"s1","bogus":true}')],
    expect: ["invalid_argument", "UNKNOWN_FIELD"],
  },
  {
    name: "a message cut short inside its envelope",
    path: `${SESSIONS}/ReadJournal`,
    streaming: true,
    ...readJournal,
    body: (message) => envelope(0, message.subarray(0, 2), message.byteLength),
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "no request message where one is needed",
    path: `${SESSIONS}/ReadJournal`,
    streaming: true,
    binary: [],
    json: [],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "two request messages where one is needed",
    path: `${SESSIONS}/ReadJournal`,
    streaming: true,
    binary: [...readJournal.binary, ...readJournal.binary],
    json: [...readJournal.json, ...readJournal.json],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "a compressed flag without an encoding (INTERNAL, as the gRPC and Connect specs demand)",
    path: `${SESSIONS}/ReadJournal`,
    streaming: true,
    ...readJournal,
    body: (message) => envelope(1, message),
    expect: ["internal", "COMPRESSED_WITHOUT_ENCODING"],
  },
  {
    name: "an encoding the server does not speak",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("s1"),
    ...compressedWith((bytes) => bytes, "zstd"),
    expect: ["unimplemented", "UNSUPPORTED_ENCODING"],
  },
  {
    name: "an encoding the server does not speak, on a stream",
    path: `${SESSIONS}/WatchSession`,
    streaming: true,
    binary: [encode(WatchSessionRequestSchema, { sessionId: "s1" })],
    json: [text('{"sessionId":"s1"}')],
    ...compressedWith((bytes) => bytes, "deflate"),
    expect: ["unimplemented", "UNSUPPORTED_ENCODING"],
  },
  {
    name: "a body that does not decompress with its declared encoding",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("s1"),
    ...compressedWith(() => Buffer.from("not gzip at all"), "gzip"),
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "a gzip-compressed request (answered as the same request uncompressed)",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("nobody"),
    ...compressedWith(gzipSync, "gzip"),
    expect: ["not_found", "SESSION_NOT_FOUND"],
  },
  {
    name: "a brotli-compressed request (answered as the same request uncompressed)",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("nobody"),
    ...compressedWith(brotliCompressSync, "br"),
    expect: ["not_found", "SESSION_NOT_FOUND"],
  },
  {
    name: "a message over the size limit",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("x".repeat(FIVE_MB)),
    expect: ["resource_exhausted", "MESSAGE_TOO_LARGE"],
  },
  {
    name: "a compressed message over the size limit once decompressed",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("x".repeat(FIVE_MB)),
    ...compressedWith(gzipSync, "gzip"),
    expect: ["resource_exhausted", "MESSAGE_TOO_LARGE"],
  },
  {
    name: "a malformed message without a token (refused before it is read)",
    path: `${SESSIONS}/GetSnapshot`,
    binary: [bin([0xff, 0xff, 0xff])],
    json: [text("not json")],
    token: null,
    expect: ["unauthenticated", "TOKEN_MISSING"],
  },
  {
    name: "a message over the size limit without a token",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("x".repeat(FIVE_MB)),
    token: null,
    expect: ["unauthenticated", "TOKEN_MISSING"],
  },
  {
    name: "an unknown field with a wrong token",
    path: `${SESSIONS}/WatchSession`,
    streaming: true,
    binary: [bin(wire.tag(77, 0), [1])],
    json: [text('{"bogus":true}')],
    token: "wrong",
    expect: ["unauthenticated", "TOKEN_INVALID"],
  },
  {
    name: "an unparseable deadline",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("s1"),
    headers: deadlineHeader("soon", "soon"),
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  ...(["WatchSession", "WatchSessions"] as const).map(
    (method): Case => ({
      name: `a deadline already passed, on ${method} (it ends at once: no abort event is coming)`,
      path: `${SESSIONS}/${method}`,
      streaming: true,
      binary: [
        method === "WatchSession" ? encode(WatchSessionRequestSchema, { sessionId: "s1" }) : encode(WatchSessionsRequestSchema, { includeCurrent: true }),
      ],
      json: [text(method === "WatchSession" ? '{"sessionId":"s1"}' : '{"includeCurrent":true}')],
      headers: deadlinePassed,
      expect: ["deadline_exceeded", "DEADLINE_EXCEEDED"],
    }),
  ),
  {
    name: "a deadline already passed, on WatchLocks",
    path: `${LOCKS}/WatchLocks`,
    streaming: true,
    binary: [encode(WatchLocksRequestSchema, { includeCurrent: true })],
    json: [text('{"includeCurrent":true}')],
    headers: deadlinePassed,
    expect: ["deadline_exceeded", "DEADLINE_EXCEEDED"],
  },
  {
    name: "a content type of no protocol (HTTP 415, nothing to tell the protocol by)",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("s1"),
    headers: () => ({ "content-type": "text/plain" }),
    expect: ["http_415"],
  },
  {
    name: "no content type",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("s1"),
    headers: () => ({ "content-type": null }),
    expect: ["http_415"],
  },
  {
    name: "a session id that breaks the id rule",
    path: `${SESSIONS}/GetSnapshot`,
    ...snapshotOf("../etc"),
    expect: ["invalid_argument", "INVALID_FIELD"],
  },
  {
    name: "a lock on a relative path",
    path: `${LOCKS}/Acquire`,
    binary: [encode(AcquireRequestSchema, { file: "src/a.ts", owner: "o" })],
    json: [text('{"file":"src/a.ts","owner":"o"}')],
    expect: ["invalid_argument", "INVALID_FIELD"],
  },
  {
    name: "a negative wait",
    path: `${LOCKS}/Acquire`,
    binary: [encode(AcquireRequestSchema, { file: "/tmp/berth-parity/a.ts", owner: "o", maxWait: { seconds: -1n } })],
    json: [text('{"file":"/tmp/berth-parity/a.ts","owner":"o","maxWait":"-1s"}')],
    expect: ["invalid_argument", "INVALID_FIELD"],
  },
  {
    name: "invalid UTF-8 in a repeated string",
    path: `${LOCKS}/KeepAlive`,
    binary: [bin(wire.bytes(1, Buffer.from("ok")), wire.bytes(1, [0xe2, 0x28, 0xa1]))],
    json: [text('{"leaseTokens":["ok","', [0xe2, 0x28, 0xa1], '"]}')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "an unknown field in a lock stream's request",
    path: `${LOCKS}/Hold`,
    streaming: true,
    binary: [Buffer.concat([encode(HoldRequestSchema, { file: "/tmp/berth-parity/b.ts", owner: "o" }), Buffer.from([0xa0, 0x06, 0x01])])],
    json: [text('{"file":"/tmp/berth-parity/b.ts","owner":"o","bogus":1}')],
    expect: ["invalid_argument", "UNKNOWN_FIELD"],
  },
  {
    name: "a lock request over the size limit",
    path: `${LOCKS}/KeepAlive`,
    binary: [encode(KeepAliveRequestSchema, { leaseTokens: ["t".repeat(FIVE_MB)] })],
    json: [text(JSON.stringify({ leaseTokens: ["t".repeat(FIVE_MB)] }))],
    expect: ["resource_exhausted", "MESSAGE_TOO_LARGE"],
  },
];

const BUDGET_CASES: readonly Case[] = [
  {
    name: "a truncated message",
    path: `${BUDGET}/Check`,
    binary: [bin(wire.tag(1, 2), [0x40, 0x01])],
    json: [text('{"need":{"items":[')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "an unknown field",
    path: `${BUDGET}/Check`,
    binary: [bin(wire.tag(50, 0), [1])],
    json: [text('{"skipLoadGates":true}')],
    expect: ["invalid_argument", "UNKNOWN_FIELD"],
  },
  {
    name: "invalid UTF-8 in a nested string",
    path: `${BUDGET}/Check`,
    binary: [bin(wire.bytes(1, wire.bytes(1, wire.bytes(2, [0x77, 0xff]))))],
    json: [text('{"need":{"items":[{"name":"w', [0xff], '"}]}}')],
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  ...(["WatchBudget", "WatchMachine"] as const).map(
    (method): Case => ({
      name: `a deadline already passed, on ${method}`,
      path: `${BUDGET}/${method}`,
      streaming: true,
      binary: [new Uint8Array()],
      json: [text("{}")],
      headers: deadlinePassed,
      expect: ["deadline_exceeded", "DEADLINE_EXCEEDED"],
    }),
  ),
  {
    name: "a message cut short inside its envelope, on a stream",
    path: `${BUDGET}/WatchMachine`,
    streaming: true,
    binary: [bin(wire.tag(1, 0), [1])],
    json: [text("{}")],
    body: (message) => envelope(0, message.subarray(0, 0), message.byteLength + 4),
    expect: ["invalid_argument", "MALFORMED_REQUEST"],
  },
  {
    name: "an encoding the server does not speak",
    path: `${BUDGET}/GetState`,
    binary: [new Uint8Array()],
    json: [text("{}")],
    ...compressedWith((bytes) => bytes, "snappy"),
    expect: ["unimplemented", "UNSUPPORTED_ENCODING"],
  },
  {
    name: "a message over the size limit",
    path: `${BUDGET}/Check`,
    binary: [encode(CheckRequestSchema, { need: { items: [{ name: "n".repeat(FIVE_MB) }] } })],
    json: [text(JSON.stringify({ need: { items: [{ name: "n".repeat(FIVE_MB) }] } }))],
    expect: ["resource_exhausted", "MESSAGE_TOO_LARGE"],
  },
  {
    name: "a malformed message without a token",
    path: `${BUDGET}/Check`,
    binary: [bin([0xff, 0xff])],
    json: [text("{")],
    token: null,
    expect: ["unauthenticated", "TOKEN_MISSING"],
  },
  {
    name: "an item without a name",
    path: `${BUDGET}/Check`,
    binary: [encode(CheckRequestSchema, { need: { items: [{ name: "" }] } })],
    json: [text('{"need":{"items":[{"name":""}]}}')],
    expect: ["invalid_argument", "INVALID_FIELD"],
  },
];

/** The request a case makes on one route. */
function requestOf(testCase: Case, route: (typeof RAW_ROUTES)[number]): RawRpcRequest {
  const streaming = testCase.streaming === true;
  const messages = (isJsonProtocol(route.protocol) ? testCase.json : testCase.binary) ?? [];
  const framing = route.protocol === "grpc" || route.protocol === "grpc-web" || streaming ? "envelope" : "body";
  const token = testCase.token === undefined ? TOKEN : testCase.token;
  return {
    ...route,
    path: testCase.path,
    streaming,
    ...(testCase.body === undefined ? { messages } : { body: testCase.body(messages[0] ?? new Uint8Array(), framing) }),
    headers: testCase.headers?.(route.protocol, framing) ?? {},
    ...(token === null ? {} : { token }),
  };
}

/** Every route's answer to a case, as `[route, code, reason, domain]`. */
async function answersTo(url: string, testCase: Case): Promise<string[][]> {
  const out: string[][] = [];
  for (const route of RAW_ROUTES) {
    const answer = await rawRpc(url, requestOf(testCase, route));
    out.push([`${route.protocol} HTTP/${route.httpVersion}`, answer.code, answer.reason ?? "-", answer.domain ?? "-"]);
  }
  return out;
}

/** What every route must answer. */
function expected(testCase: Case): string[][] {
  const [code, reason] = testCase.expect;
  const domain = reason === undefined ? "-" : testCase.path.split("/")[1]!.split(".").slice(0, 2).join(".");
  return RAW_ROUTES.map((route) => [`${route.protocol} HTTP/${route.httpVersion}`, code, reason ?? "-", domain]);
}

it("covers at least 30 malformed inputs", () => {
  expect(SESSION_CASES.length + BUDGET_CASES.length).toBeGreaterThanOrEqual(30);
});

for (const store of STORES) {
  describe(`the sessions service's answers to malformed requests (${store} store)`, storeTags(store), () => {
    let url: string;
    beforeAll(async () => {
      url = (await startService("sessions", await onStore(store, { args: ["--token", TOKEN] }))).url("sessions");
    });

    it.each(SESSION_CASES.map((c) => [c.name, c]))("%s: the same code and reason on every protocol", async (_name, testCase) => {
      expect(await answersTo(url, testCase)).toEqual(expected(testCase));
    });

    it("still serves every protocol afterwards", async () => {
      for (const [i, { options }] of PROTOCOLS.entries()) {
        const client = connectClient(SessionService, url, { ...options, token: TOKEN });
        const sessionId = `after-${store}-${i}`;
        await client.appendEvent({ sessionId, event: { kind: { case: "steer", value: {} } } });
        expect((await client.getSnapshot({ sessionId })).lastSeq).toBe(1n);
      }
    });
  });
}

describe("the budget service's answers to malformed requests", () => {
  let url: string;
  beforeAll(async () => {
    url = (await startBudget({ args: ["--token", TOKEN] })).url;
  });

  it.each(BUDGET_CASES.map((c) => [c.name, c]))("%s: the same code and reason on every protocol", async (_name, testCase) => {
    expect(await answersTo(url, testCase)).toEqual(expected(testCase));
  });

  it("still serves every protocol afterwards", async () => {
    for (const { options } of PROTOCOLS) {
      const client = connectClient(BudgetService, url, { ...options, token: TOKEN });
      expect((await client.getLimits({})).$typeName).toBe("berth.budget.v1.GetLimitsResponse");
    }
  });
});
