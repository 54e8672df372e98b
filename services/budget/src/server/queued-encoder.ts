/**
 * The `Queued` messages of an Admit or Reserve stream, built for many waiters at once (see
 * {@link QueuedEncoder}).
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import { DurationSchema, TimestampSchema } from "@bufbuild/protobuf/wkt";
import { createIdentityCache } from "@berth/shared/server/identity-cache";
import { preEncodedField } from "@berth/shared/server/pre-encoded";
import { Gate, WaitReasonSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { WaitReason } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitResponse, AheadEntry as AheadEntryMessage, Queued } from "@berth/api/berth/budget/v1/budget_service_pb";
import { AdmitResponseSchema, AheadEntrySchema, QueuedSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { AheadEntry, QueuedUpdate, Reason } from "../index.js";
import type { ReasonContext } from "./budget-encode.js";
import { durationOf, queueWaitReason, resourcesToProto, timestampOf, waitReasonToProto } from "./budget-encode.js";

/** The field numbers the hand-written encoder writes, read once from the generated descriptors. */
const FIELD = {
  queued: AdmitResponseSchema.field.queued.number,
  position: QueuedSchema.field.position.number,
  eta: QueuedSchema.field.eta.number,
  waitFor: QueuedSchema.field.waitFor.number,
  waitForText: QueuedSchema.field.waitForText.number,
  ahead: QueuedSchema.field.ahead.number,
  waitExpireTime: QueuedSchema.field.waitExpireTime.number,
  etaBasis: QueuedSchema.field.etaBasis.number,
  seconds: DurationSchema.field.seconds.number,
  nanos: DurationSchema.field.nanos.number,
  gate: WaitReasonSchema.field.gate.number,
  message: WaitReasonSchema.field.message.number,
  observed: WaitReasonSchema.field.observed.number,
} as const;

/** A stream's deadline: clock ms, and its Timestamp encoded. */
export interface QueuedDeadline {
  readonly ms: number;
  readonly bytes: Uint8Array;
}

/**
 * Builds `Queued` messages for a stream of updates. Heartbeats repeat the same first waiter's
 * reasons and the same requests ahead to every waiter, so their messages are converted once (by
 * identity: the queue hands every waiter the same objects until they change) and shared.
 *
 * {@link response} picks the form: for a call whose messages are protobuf binary, the hot path
 * {@link encodeResponse}, the AdmitResponse of a heartbeat with its `queued` field already in wire
 * form; for any other call (JSON) the real message, since JSON serialization skips a pre-encoded
 * field (see the server's pre-encoded.ts). With 10,000 waiters every beat is 10,000 messages;
 * encoding each through the reflective writer cost a dozen nested messages and half a dozen growing
 * buffers apiece, while here the parts shared by every waiter are encoded once and each message is
 * one pass of a reused writer. The bytes are the same as `toBinary` of {@link encode}'s message
 * (tested).
 */
export class QueuedEncoder {
  private readonly reasons = createIdentityCache((reason: Reason): WaitReason => waitReasonToProto(reason, this.context()));
  private readonly reasonBytes = createIdentityCache((reason: Reason) => toBinary(WaitReasonSchema, this.reasons.get(reason)));
  private readonly aheadLists = createIdentityCache((ahead: readonly AheadEntry[]): AheadEntryMessage[] =>
    ahead.map((entry, index) => create(AheadEntrySchema, { owner: entry.owner, position: index + 1, need: resourcesToProto(entry.needs) })),
  );
  /** Every entry of a list as Queued's `ahead` field (tag, length, AheadEntry), in one block. */
  private readonly aheadBytes = createIdentityCache((ahead: readonly AheadEntry[]) => {
    const w = new BinaryWriter();
    ahead.forEach((entry, index) => {
      const message = create(AheadEntrySchema, { owner: entry.owner, position: index + 1, need: resourcesToProto(entry.needs) });
      w.tag(FIELD.ahead, WireType.LengthDelimited).bytes(toBinary(AheadEntrySchema, message));
    });
    return w.finish();
  });
  /** Reused for every message: `finish()` hands out a copy and keeps the grown buffer. */
  private readonly writer = new BinaryWriter();

  constructor(private readonly context: () => ReasonContext) {}

  /** A stream's deadline (clock ms) in both forms the responses need: it never changes. */
  static deadline(ms: number): QueuedDeadline {
    return { ms, bytes: toBinary(TimestampSchema, timestampOf(ms)) };
  }

  /** `AdmitResponse{queued}` for `update`: pre-encoded when `binary` (the call's messages are protobuf binary), else a real message. */
  response(update: QueuedUpdate, deadline: QueuedDeadline, binary: boolean): AdmitResponse {
    if (binary) return this.encodeResponse(update, deadline.bytes);
    return create(AdmitResponseSchema, { kind: { case: "queued", value: this.encode(update, deadline.ms) } });
  }

  /** The Queued message for `update`, for a request whose wait runs out at `deadline` (clock ms). */
  encode(update: QueuedUpdate, deadline: number): Queued {
    const waitFor = update.waitFor.map((reason) => (reason.gate === "queue" ? queueWaitReason(update.aheadCount) : this.reasons.get(reason)));
    const ahead = this.aheadLists.get(update.ahead);
    return create(QueuedSchema, {
      position: update.position,
      ...(update.etaMs === undefined ? {} : { eta: durationOf(update.etaMs) }),
      waitFor,
      waitForText: update.waitForText,
      ahead,
      waitExpireTime: timestampOf(deadline),
      etaBasis: update.etaBasis,
    });
  }

  /** `AdmitResponse{queued: encode(update, deadline)}`, with the queued field already encoded (see the class comment). */
  encodeResponse(update: QueuedUpdate, deadlineBytes: Uint8Array): AdmitResponse {
    const w = this.writer;
    // The queued field's payload, length-prefixed: what follows its tag on the wire.
    w.fork();
    w.tag(FIELD.position, WireType.Varint).uint32(update.position);
    if (update.etaMs !== undefined) {
      const eta = Math.max(0, Math.round(update.etaMs));
      w.tag(FIELD.eta, WireType.LengthDelimited).fork();
      if (eta >= 1000) w.tag(FIELD.seconds, WireType.Varint).int64(Math.floor(eta / 1000));
      if (eta % 1000 !== 0) w.tag(FIELD.nanos, WireType.Varint).int32((eta % 1000) * 1_000_000);
      w.join();
    }
    for (const reason of update.waitFor) {
      if (reason.gate === "queue") {
        w.tag(FIELD.waitFor, WireType.LengthDelimited).fork();
        w.tag(FIELD.gate, WireType.Varint).int32(Gate.QUEUE);
        w.tag(FIELD.message, WireType.LengthDelimited).string(`${update.aheadCount} request(s) ahead in the queue`);
        if (update.aheadCount !== 0) w.tag(FIELD.observed, WireType.Bit64).double(update.aheadCount);
        w.join();
      } else {
        w.tag(FIELD.waitFor, WireType.LengthDelimited).bytes(this.reasonBytes.get(reason));
      }
    }
    if (update.waitForText !== "") w.tag(FIELD.waitForText, WireType.LengthDelimited).string(update.waitForText);
    w.raw(this.aheadBytes.get(update.ahead));
    w.tag(FIELD.waitExpireTime, WireType.LengthDelimited).bytes(deadlineBytes);
    if (update.etaBasis !== "") w.tag(FIELD.etaBasis, WireType.LengthDelimited).string(update.etaBasis);
    w.join();
    const response = create(AdmitResponseSchema);
    response.$unknown = [preEncodedField(FIELD.queued, w.finish())];
    return response;
  }
}
