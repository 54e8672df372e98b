/**
 * For the journal suites: a sessions client's call deadline, an event from its kind, and the
 * comparison of a served snapshot with a replay of the journal file.
 */
import { create, toJson, type JsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import type { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";

/** A call's deadline: far beyond any answer on a loaded machine, so a timeout means a hang. */
export const CALL_DEADLINE_MS = 30_000;

export type Sessions = Client<typeof SessionService>;

export function event(kind: MessageInitShape<typeof EventSchema>["kind"]): Event {
  return create(EventSchema, { kind });
}

export function range(from: number, to: number): number[] {
  return Array.from({ length: to - from + 1 }, (_, i) => from + i);
}

/**
 * The served snapshot as JSON without the notes of torn-tail repairs: those are facts about the
 * file's history (a repair at some open), not derived from the entries, so a replay of today's
 * file cannot have them. They stay in a snapshot file written after the repair.
 */
export function withoutRepairNotes(snapshot: Snapshot | undefined): JsonObject | undefined {
  if (snapshot === undefined) return undefined;
  const json = toJson(SnapshotSchema, snapshot) as JsonObject;
  const diagnostics = (json.diagnostics as JsonObject[] | undefined) ?? [];
  const kept = diagnostics.filter((d) => d.error !== "journal_torn_tail_repaired");
  const removed = diagnostics.length - kept.length;
  if (removed === 0) return json;
  const result: JsonObject = { ...json };
  if (kept.length > 0) result.diagnostics = kept;
  else delete result.diagnostics;
  const total = Number(json.diagnosticsTotal ?? 0) - removed;
  if (total > 0) result.diagnosticsTotal = total;
  else delete result.diagnosticsTotal;
  return result;
}
