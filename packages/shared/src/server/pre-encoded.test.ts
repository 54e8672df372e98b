import { describe, expect, it } from "vitest";
import { sendsBinary } from "./pre-encoded.js";

const call = (contentType: string | null, requestMethod = "POST") => ({
  requestMethod,
  requestHeader: new Headers(contentType === null ? {} : { "content-type": contentType }),
});

describe("sendsBinary", () => {
  it.each([
    "application/grpc",
    "application/grpc+proto",
    "application/grpc-web",
    "application/grpc-web+proto",
    "application/proto",
    "application/connect+proto",
    "Application/GRPC+Proto",
  ])("is true for %s", (contentType) => expect(sendsBinary(call(contentType))).toBe(true));

  it.each([
    "application/grpc+json",
    "application/grpc-web+json",
    "application/json",
    "application/json; charset=utf-8",
    "application/connect+json",
    "application/grpc+protox",
    "text/plain",
  ])("is false for %s: the response must carry real fields", (contentType) => expect(sendsBinary(call(contentType))).toBe(false));

  it("is false without a content type and for a Connect GET (its encoding is in the query)", () => {
    expect(sendsBinary(call(null))).toBe(false);
    expect(sendsBinary(call(null, "GET"))).toBe(false);
    expect(sendsBinary(call("application/proto", "GET"))).toBe(false);
  });
});
