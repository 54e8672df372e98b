import fc from "fast-check";
import { describe, expect, it } from "vitest";
import * as z from "zod";
import { NeedItemKindSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { AcquireRequestSchema } from "@berth/api/berth/locks/v1/lock_service_pb";
import { appendableEvent, eventToJournal, typedEventShapes } from "@berth/client/journal-events";
import { enumNames, eventSchema, fieldsOf, SESSION_ID_PATTERN } from "./schemas.js";

/** What the service's codec makes of a journal event: accepted, or refused naming a field. */
function serviceAccepts(event: Record<string, unknown>): boolean {
  try {
    eventToJournal(appendableEvent(event));
    return true;
  } catch {
    return false;
  }
}

const events = eventSchema();

describe("eventSchema", () => {
  it("has one object per typed event type, with every typed key of its message", () => {
    const listed = z.toJSONSchema(events) as { anyOf: Array<{ properties: Record<string, { const?: string }> }> };
    const typed = listed.anyOf.filter((v) => v.properties.type?.const !== undefined);
    expect(typed.map((v) => v.properties.type!.const)).toEqual(typedEventShapes().map((s) => s.type));
    for (const shape of typedEventShapes()) {
      const variant = typed.find((v) => v.properties.type!.const === shape.type)!;
      expect(Object.keys(variant.properties).sort(), shape.type).toEqual(["type", ...shape.fields.map((f) => f.jsonKey)].sort());
    }
    expect(listed.anyOf).toHaveLength(typed.length + 1);
  });

  it("accepts exactly the journal events the service's codec accepts", () => {
    const shapes = typedEventShapes();
    const json = fc.oneof(
      fc.string(),
      fc.boolean(),
      fc.constant(null),
      fc.integer({ min: -5, max: 5 }),
      fc.constantFrom(0.5, -1, 4294967295, 4294967296, 2 ** 53 - 1, 2 ** 53, -(2 ** 53)),
      fc.array(fc.integer(), { maxLength: 2 }),
      fc.dictionary(fc.string({ maxLength: 3 }), fc.integer(), { maxKeys: 2 }),
    );
    const type = fc.oneof(
      fc.constantFrom(...shapes.map((s) => s.type)),
      fc.string({ maxLength: 6 }),
      fc.constantFrom("", "t".repeat(128), "t".repeat(129), "é".repeat(128), "😀".repeat(128), "😀".repeat(129)),
    );
    const event = type.chain((t) => {
      const keys = shapes.find((s) => s.type === t)?.fields.map((f) => f.jsonKey) ?? ["count", "phase"];
      return fc.dictionary(fc.constantFrom(...keys, "note"), json, { maxKeys: 4 }).map((fields) => ({ ...fields, type: t }));
    });
    fc.assert(
      fc.property(event, (e) => {
        expect(events.safeParse(e).success, JSON.stringify(e)).toBe(serviceAccepts(e));
      }),
      { numRuns: 2000 },
    );
  });
});

describe("fieldsOf", () => {
  it("names a field by its JSON name, a Duration in milliseconds, describes it by its comment, and bounds it as asked", () => {
    const shape = fieldsOf(AcquireRequestSchema, { owner: { min: 1, max: 3, note: "More." }, max_wait: {}, file: { required: true, description: "Given." } });
    expect(Object.keys(shape)).toEqual(["owner", "maxWaitMs", "file"]);
    const schema = z.strictObject(shape);
    expect(schema.safeParse({ file: "a", owner: "abc", maxWaitMs: 0 }).success).toBe(true);
    expect(schema.safeParse({ file: "a", owner: "abcd" }).success).toBe(false);
    expect(schema.safeParse({ file: "a", owner: "" }).success).toBe(false);
    expect(schema.safeParse({ file: "a", maxWaitMs: -1 }).success).toBe(false);
    expect(schema.safeParse({ owner: "a" }).success).toBe(false);
    expect(schema.safeParse({ file: "a", ttl: 1 }).success).toBe(false);
    expect(shape.owner!.description).toMatch(/^Who asks: shown to other waiters.* More\.$/);
    expect(shape.maxWaitMs!.description).toMatch(/In milliseconds\.$/);
    expect(shape.file!.description).toBe("Given.");
  });

  it("throws for a field the message does not have", () => {
    expect(() => fieldsOf(AcquireRequestSchema, { no_such_field: {} })).toThrow(/berth.locks.v1.AcquireRequest has no field no_such_field/);
  });

  it("gives an enum's values by their short names, without the unspecified one", () => {
    expect(enumNames(NeedItemKindSchema)).toEqual(["build", "start", "appliance"]);
  });
});

describe("SESSION_ID_PATTERN", () => {
  it("is the service's rule", () => {
    for (const id of ["a", "A-z_0", "s".repeat(128)]) expect(SESSION_ID_PATTERN.test(id), id).toBe(true);
    for (const id of ["", "s".repeat(129), "a b", "a/b", "é"]) expect(SESSION_ID_PATTERN.test(id), id).toBe(false);
  });
});
