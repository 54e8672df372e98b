import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { describe, expect, it } from "vitest";
import type { FuzzCase } from "./fuzz-cases.js";
import { buildRequest } from "./fuzz-requests.js";
import { envelope } from "./fuzz-framing.js";

const DELETE = SessionService.method.deleteSession;
const JSON_TEXT = '{"sessionId":"fz-2"}';

function deleteCase(overrides: Partial<FuzzCase>): FuzzCase {
  return {
    methodIndex: 0,
    transport: "grpc",
    format: "json",
    init: {},
    jsonText: JSON_TEXT,
    jsonFromInit: false,
    mutations: [],
    framing: "normal",
    contentType: undefined,
    deadline: 500,
    extraHeaders: {},
    dropTe: false,
    socketBytes: [],
    settle: "status",
    requestEnd: "end",
    ...overrides,
  };
}

function parsedBody(overrides: Partial<FuzzCase>): string {
  const built = buildRequest(deleteCase(overrides), DELETE, { lease: [], reservation: [], running: [] }, 1, 4 * 1024 * 1024);
  return Buffer.from(built.messageBytes).toString("utf8");
}

// The judge attributes an acknowledged DeleteSession by the message the server parsed: it must be
// the one the content type makes the server read, whatever the transport meant to send.
describe("the message the server reads, by content type", () => {
  it("a gRPC transport's unframed body labelled application/json is a Connect unary call of that message", () => {
    expect(parsedBody({ framing: "unframed", contentType: "application/json; charset=utf-8" })).toBe(JSON_TEXT);
    expect(parsedBody({ framing: "unframed", contentType: "application/json" })).toBe(JSON_TEXT);
  });

  it("a gRPC envelope labelled application/json is read whole, prefix and all (which parses as no message)", () => {
    expect(parsedBody({ contentType: "application/json" })).toBe(Buffer.from(envelope(0, Buffer.from(JSON_TEXT))).toString("utf8"));
  });

  it("a gRPC content type reads the envelope's message, and nothing from an unframed body", () => {
    expect(parsedBody({})).toBe(JSON_TEXT);
    expect(parsedBody({ framing: "odd-flags" })).toBe(JSON_TEXT);
    expect(parsedBody({ framing: "unframed" })).toBe("");
  });

  it("a Connect unary body labelled gRPC, or with no content type, gives no message", () => {
    expect(parsedBody({ transport: "connect-h2", contentType: "application/grpc+json" })).toBe("");
    expect(parsedBody({ transport: "connect-h2" })).toBe(JSON_TEXT);
    expect(parsedBody({ contentType: null })).toBe("");
  });
});
