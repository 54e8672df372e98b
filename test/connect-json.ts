/**
 * What the Connect JSON tests share (connect-json-unary and connect-json-errors .test.ts): the
 * services under test, a sessions service and a budget on the fixture machine of budget-e2e.ts (so
 * no verdict depends on this machine); calls posted as JSON with the real `curl` (each noted, so the
 * unary file can check it called every unary RPC); Connect's error JSON and its streaming frames,
 * read and checked for their shape.
 */
import { mkdirSync } from "node:fs";
import * as path from "node:path";
import { fromBinary, toJson, type DescMessage } from "@bufbuild/protobuf";
import { StructSchema } from "@bufbuild/protobuf/wkt";
import { expect } from "vitest";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { G, startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import { curl, curlJson, makeTempDir, startService, type CurlJsonResponse, type CurlResponse } from "./harness.js";

export type Json = Record<string, unknown>;

export const SERVICES = [SessionService, LockService, BudgetService];
const calls = new Set<string>();
/** The RPCs this test file posted through {@link call}, as `<service>/<method>`. */
export const called: ReadonlySet<string> = calls;

/** A sessions service, a project root for the locked files, and a budget on the fixture machine. */
export interface ConnectJsonServices {
  sessionsUrl: string;
  projectRoot: string;
  budget: BudgetUnderTest;
}

export async function startConnectJsonServices(): Promise<ConnectJsonServices> {
  const projectRoot = path.join(makeTempDir("berth-connect-json-"), "project");
  mkdirSync(projectRoot, { recursive: true });
  const [sessions, budget] = await Promise.all([startService("sessions"), startBudget()]);
  return { sessionsUrl: sessions.url("sessions"), projectRoot, budget };
}

/** POSTs `body` as JSON to `/<service>/<method>` with curl, noting the RPC as called. */
export async function call(url: string, service: { typeName: string }, method: string, body: unknown): Promise<CurlJsonResponse> {
  calls.add(`${service.typeName}/${method}`);
  return curlJson(url, `/${service.typeName}/${method}`, body);
}

/** A successful unary answer: 200, JSON, the message as an object. */
export async function ok(url: string, service: { typeName: string }, method: string, body: unknown): Promise<Json> {
  const response = await call(url, service, method, body);
  expect(response.status, `${method}: ${response.body}`).toBe(200);
  expect(response.headers["content-type"]).toMatch(/^application\/json/);
  expect(typeof response.json).toBe("object");
  return response.json as Json;
}

/** One entry of a Connect error's `details`. */
export interface ErrorDetail {
  type: string;
  value: string;
  debug?: unknown;
}

/** Connect's error JSON, checked for its shape: a code, a message, and details (when any) that decode. */
export function connectError(response: CurlJsonResponse): { code: string; message: string; details: ErrorDetail[] } {
  expect(response.headers["content-type"]).toMatch(/^application\/json/);
  const json = response.json as { code?: unknown; message?: unknown; details?: unknown };
  expect(typeof json.code, response.body).toBe("string");
  expect(typeof json.message).toBe("string");
  expect(
    Object.keys(json).every((key) => ["code", "message", "details"].includes(key)),
    `unexpected keys in ${response.body}`,
  ).toBe(true);
  const details = (json.details ?? []) as ErrorDetail[];
  expect(Array.isArray(details)).toBe(true);
  for (const detail of details) {
    expect(typeof detail.type).toBe("string");
    // base64 (padding optional, as Connect allows).
    expect(detail.value).toMatch(/^[A-Za-z0-9+/_-]*={0,2}$/);
  }
  return { code: json.code as string, message: json.message as string, details };
}

/** The detail of `type` decoded from its base64 `value` (not from `debug`, which clients may not get). */
export function detail<S extends DescMessage>(details: ErrorDetail[], schema: S) {
  const found = details.find((d) => d.type === schema.typeName);
  if (found === undefined) throw new Error(`no ${schema.typeName} detail in ${JSON.stringify(details.map((d) => d.type))}`);
  return fromBinary(schema, Buffer.from(found.value, "base64"));
}

/** A unary refusal's HTTP status, code and ErrorInfo reason (the ErrorInfo decoded from its base64 value, its domain checked). */
export function refusalOf(response: CurlJsonResponse, domain = "berth.sessions"): [number, string, string] {
  const error = connectError(response);
  const info = detail(error.details, ErrorInfoSchema);
  expect(info.domain).toBe(domain);
  return [response.status, error.code, info.reason];
}

/**
 * A server-streaming call as Connect's streaming JSON over HTTP/1.1 with curl: the request in one
 * envelope (flags, 4-byte length, JSON), the answer as its envelopes (the last one, flagged
 * end-stream, holds `error` when the stream failed). Requests are kept under 128 bytes, so their
 * length prefix is plain ASCII on the way in.
 */
export async function curlServerStream(url: string, service: { typeName: string }, method: string, body: unknown): Promise<{ messages: Json[]; end: Json }> {
  const json = JSON.stringify(body);
  expect(json.length).toBeLessThan(128);
  const response = await curl(url, `/${service.typeName}/${method}`, {
    method: "POST",
    headers: { "content-type": "application/connect+json" },
    body: `\u0000\u0000\u0000\u0000${String.fromCharCode(json.length)}${json}`,
  });
  expect(response.status, response.body).toBe(200);
  expect(response.headers["content-type"]).toMatch(/^application\/connect\+json/);
  return streamFrames(response);
}

/**
 * The envelopes of a streamed answer. curl's output arrives as text: each 5-byte prefix stays 5
 * characters (a byte that is not UTF-8 becomes one U+FFFD), and each message is one JSON object,
 * whose end is found by matching its braces outside strings.
 */
export function streamFrames(response: CurlResponse): { messages: Json[]; end: Json } {
  const text = response.body;
  const messages: Json[] = [];
  let at = 0;
  while (at < text.length) {
    const flags = text.charCodeAt(at);
    const start = at + 5;
    let depth = 0;
    let inString = false;
    let stop = start;
    for (; stop < text.length; stop++) {
      const c = text[stop];
      if (inString) {
        if (c === "\\") stop++;
        else if (c === '"') inString = false;
      } else if (c === '"') inString = true;
      else if (c === "{") depth++;
      else if (c === "}" && --depth === 0) break;
    }
    const message = JSON.parse(text.slice(start, stop + 1)) as Json;
    if ((flags & 0x02) !== 0) return { messages, end: message };
    messages.push(message);
    at = stop + 1;
  }
  throw new Error(`no end-stream message in ${JSON.stringify(text)}`);
}

/** The code and ErrorInfo reason a streamed answer ended with. */
export function streamRefusal(end: Json): [string, string] {
  const error = end["error"] as { code: string; details?: ErrorDetail[] };
  const info = detail(error.details ?? [], ErrorInfoSchema);
  expect(info.domain).toBe("berth.sessions");
  return [error.code, info.reason];
}

/** A refusal of a malformed request: HTTP 400, `invalid_argument`, the message naming the field, `{field, rule}` as a Struct detail. */
export async function expectInvalidArgument(url: string, service: { typeName: string }, method: string, body: unknown, field: string): Promise<string> {
  const response = await curlJson(url, `/${service.typeName}/${method}`, body);
  expect(response.status, `${method}: ${response.body}`).toBe(400);
  const error = connectError(response);
  expect(error.code).toBe("invalid_argument");
  expect(error.message.startsWith(`${field}: `), `${method}: "${error.message}" should start with "${field}: "`).toBe(true);
  const struct = toJson(StructSchema, detail(error.details, StructSchema)) as Json;
  expect(struct["field"]).toBe(field);
  expect(error.message).toBe(`${field}: ${String(struct["rule"])}`);
  return error.message;
}

export const startItem = (name: string, memoryGb: number) => ({ kind: "NEED_ITEM_KIND_START", name, cost: { memoryBytes: String(memoryGb * G), cpu: 1 } });
