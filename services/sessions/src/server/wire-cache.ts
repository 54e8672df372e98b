/**
 * Encoding a snapshot or a journal entry once for every response that carries it.
 *
 * One appended entry reaches the appender's response and every watcher of its session, each with
 * the snapshot it produced. Serializing that snapshot is the costly step (a `toBinary` of a typical
 * snapshot is several times its conversion from the reducer's object), and it would be repeated
 * per watcher. So, for the calls whose messages are protobuf binary, the field is encoded once,
 * cached by the (immutable, shared) reducer object, and placed in each response as an already
 * encoded field (see the server's pre-encoded.ts, which also says when a call is binary); every
 * other call gets the converted message (also cached).
 *
 * The caches are WeakMaps keyed by the reducer's objects: an entry lives as long as the store or a
 * watcher's buffer holds the object, and costs nothing afterwards.
 */
import { toBinary, type UnknownField } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import { JournalEntrySchema, type JournalEntry as JournalEntryMessage } from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { preEncodedField } from "@berth/shared/server/pre-encoded";
import type { JournalEntry, SessionSnapshot } from "../reducer.js";
import { journalEntryToProto, type JournalEntryFacts } from "./event-codec.js";
import { snapshotToProto } from "./snapshot-codec.js";

/** The payload of a length-delimited field: the encoded message behind its length. */
type FieldPayload = Uint8Array;

const snapshotMessages = new WeakMap<SessionSnapshot, Snapshot>();
const snapshotPayloads = new WeakMap<SessionSnapshot, FieldPayload>();
const entryMessages = new WeakMap<JournalEntry, JournalEntryMessage>();
const entryPayloads = new WeakMap<JournalEntry, FieldPayload>();

/** The Snapshot message for a reducer snapshot, converted once per snapshot object. */
export function snapshotMessage(snapshot: SessionSnapshot): Snapshot {
  let message = snapshotMessages.get(snapshot);
  if (message === undefined) {
    message = snapshotToProto(snapshot);
    snapshotMessages.set(snapshot, message);
  }
  return message;
}

/**
 * The JournalEntry message for a journal entry as the store hands it out, converted once per entry
 * object (a live entry is one object shared by every watcher, and so are its facts).
 */
export function entryMessage(entry: JournalEntry, facts: JournalEntryFacts): JournalEntryMessage {
  let message = entryMessages.get(entry);
  if (message === undefined) {
    message = journalEntryToProto(entry as unknown as Record<string, unknown>, facts);
    entryMessages.set(entry, message);
  }
  return message;
}

/** `snapshot` as field `no` of a response, encoded once per snapshot object. */
export function encodedSnapshotField(no: number, snapshot: SessionSnapshot): UnknownField {
  let payload = snapshotPayloads.get(snapshot);
  if (payload === undefined) {
    payload = lengthDelimited(toBinary(SnapshotSchema, snapshotMessage(snapshot)));
    snapshotPayloads.set(snapshot, payload);
  }
  return preEncodedField(no, payload);
}

/** `entry` as field `no` of a response, encoded once per entry object. */
export function encodedEntryField(no: number, entry: JournalEntry, facts: JournalEntryFacts): UnknownField {
  let payload = entryPayloads.get(entry);
  if (payload === undefined) {
    payload = lengthDelimited(toBinary(JournalEntrySchema, entryMessage(entry, facts)));
    entryPayloads.set(entry, payload);
  }
  return preEncodedField(no, payload);
}

function lengthDelimited(bytes: Uint8Array): FieldPayload {
  return new BinaryWriter().bytes(bytes).finish();
}
