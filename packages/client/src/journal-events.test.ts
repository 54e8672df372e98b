/** The codec's own contract as a client sees it (its cases are tested with the service that writes the journal: services/sessions/src/server/event-codec.test.ts). */
import { create } from "@bufbuild/protobuf";
import { EventSchema } from "@berth/api/berth/sessions/v1/events_pb";
import { describe, expect, it } from "vitest";
import { appendableEvent, eventToJournal, InvalidEventError, journalToEvent } from "./journal-events.js";

describe("journal events", () => {
  it("round-trips a journal event through the typed event, keys the typed fields cannot hold in extra", () => {
    const journal = { type: "generate", pageUrl: "/p", count: "three", prompt: "bolder" };
    const event = journalToEvent(journal);
    expect(event.kind).toMatchObject({ case: "generate", value: { pageUrl: "/p", extra: { count: "three", prompt: "bolder" } } });
    expect(eventToJournal(event)).toStrictEqual(journal);
  });

  it("refuses an event that breaks a rule of events.proto with InvalidEventError naming the field", () => {
    const event = create(EventSchema, { kind: { case: "generate", value: { count: 2, extra: { count: 3 } } } });
    let error: unknown;
    try {
      eventToJournal(event, "events[1]");
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(InvalidEventError);
    expect(error).toMatchObject({ field: "events[1].generate.extra.count", message: expect.stringMatching(/^events\[1\]\.generate\.extra\.count: collides with the typed field count/) });
  });

  it("appendableEvent: a typed key must hold its type (refused naming the field and the key), other keys go to extra", () => {
    expect(appendableEvent({ type: "generate", pageUrl: "/p", count: 3, prompt: "bolder" }).kind).toMatchObject({
      case: "generate",
      value: { pageUrl: "/p", count: 3, extra: { prompt: "bolder" } },
    });
    expect(appendableEvent({ type: "resume", anything: "goes" }).kind).toMatchObject({ case: "other", value: { type: "resume", fields: { anything: "goes" } } });
    for (const [event, field, rule] of [
      [{ type: "generate", count: "abc" }, "event.generate.count", 'the event\'s "count" must be a whole number from 0 to 4294967295, got "abc"'],
      [{ type: "generate", count: -1 }, "event.generate.count", 'the event\'s "count" must be a whole number from 0 to 4294967295, got -1'],
      [{ type: "generate", pageUrl: null }, "event.generate.page_url", 'the event\'s "pageUrl" must be a string, got null'],
    ] as const) {
      expect(() => appendableEvent(event)).toThrow(InvalidEventError);
      expect(() => appendableEvent(event)).toThrow(`${field}: ${rule}`);
    }
    // What the seed's processes wrote still reads back as it was.
    expect(journalToEvent({ type: "generate", count: "abc" }).kind).toMatchObject({ case: "generate", value: { extra: { count: "abc" } } });
  });
});
