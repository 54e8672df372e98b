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
 * The caches are identity caches (the server's identity-cache.ts) keyed by the reducer's objects:
 * an entry lives as long as the store or a watcher's buffer holds the object, and costs nothing
 * afterwards.
 */
import { toBinary, type UnknownField } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import { JournalEntrySchema, type JournalEntry as JournalEntryMessage } from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { createIdentityCache } from "@berth/shared/server/identity-cache";
import { preEncodedField } from "@berth/shared/server/pre-encoded";
import type { JournalEntry, SessionSnapshot } from "../reducer.js";
import { journalEntryToProto, type JournalEntryFacts } from "./event-codec.js";
import { snapshotToProto } from "./snapshot-codec.js";

const snapshotMessages = createIdentityCache((snapshot: SessionSnapshot): Snapshot => snapshotToProto(snapshot));
const snapshotPayloads = createIdentityCache((snapshot: SessionSnapshot) => lengthDelimited(toBinary(SnapshotSchema, snapshotMessages.get(snapshot))));
// Keyed by the entry alone: a live entry is one object shared by every watcher, and so are its facts.
const entryMessages = createIdentityCache(
  (entry: JournalEntry, facts: JournalEntryFacts): JournalEntryMessage => journalEntryToProto(entry as unknown as Record<string, unknown>, facts),
);
const entryPayloads = createIdentityCache((entry: JournalEntry, facts: JournalEntryFacts) =>
  lengthDelimited(toBinary(JournalEntrySchema, entryMessages.get(entry, facts))),
);

/** The Snapshot message for a reducer snapshot, converted once per snapshot object. */
export function snapshotMessage(snapshot: SessionSnapshot): Snapshot {
  return snapshotMessages.get(snapshot);
}

/**
 * The JournalEntry message for a journal entry as the store hands it out, converted once per entry
 * object (a live entry is one object shared by every watcher, and so are its facts).
 */
export function entryMessage(entry: JournalEntry, facts: JournalEntryFacts): JournalEntryMessage {
  return entryMessages.get(entry, facts);
}

/** `snapshot` as field `no` of a response, encoded once per snapshot object. */
export function encodedSnapshotField(no: number, snapshot: SessionSnapshot): UnknownField {
  return preEncodedField(no, snapshotPayloads.get(snapshot));
}

/** `entry` as field `no` of a response, encoded once per entry object. */
export function encodedEntryField(no: number, entry: JournalEntry, facts: JournalEntryFacts): UnknownField {
  return preEncodedField(no, entryPayloads.get(entry, facts));
}

/** The payload of a length-delimited field: the encoded message behind its length. */
function lengthDelimited(bytes: Uint8Array): Uint8Array {
  return new BinaryWriter().bytes(bytes).finish();
}
