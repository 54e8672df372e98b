/**
 * The typed view of a session snapshot: the reducer's JSON snapshot (the seed's
 * `<id>.snapshot.json` shape) as a `berth.sessions.v1.Snapshot` message.
 *
 * Events sent through berth's API always give values of the declared types, but the reducer does
 * not validate (neither does the seed), and a journal written by another program can put any JSON
 * value in any field. snapshot.proto's rule for those: a number field takes a number, or a number
 * parsed from a numeric string, when it fits the field's type (a uint32 takes an integer from 0 to
 * 2^32−1, an int64 a safe integer); anything else leaves the field unset (zero when it has no
 * presence). A string field takes only strings. The seed's in-memory oddities follow the same
 * rule: `visibleVariant` NaN (its `Number(undefined)`) is unset, `message: undefined` is unset.
 *
 * Cheap on purpose (it runs for every append response and every watcher message): one pass over
 * the fields, messages built as plain objects (what `create` returns) rather than through the
 * descriptors, and JSON-typed fields (`paramValues`, `pendingEvent`, `sourceMarkers`) handed over
 * by reference, not copied. The result shares those subtrees with the snapshot: treat both as
 * immutable.
 */
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import {
  AnnotationArtifactSchema,
  DiagnosticSchema,
  GenerationTimingSchema,
  MountFailureSchema,
  SnapshotSchema,
  type AnnotationArtifact,
  type Diagnostic,
  type GenerationTiming,
  type MountFailure,
  type Snapshot,
} from "@berth/api/berth/sessions/v1/snapshot_pb";
import type { SessionSnapshot } from "../reducer.js";
import { setOwn, toProtoListValue, toProtoValue } from "@berth/wire/journal-events";
import { isoToTimestamp } from "./timestamps.js";

const SNAPSHOT_TYPE = SnapshotSchema.typeName;
const TIMING_TYPE = GenerationTimingSchema.typeName;
const ARTIFACT_TYPE = AnnotationArtifactSchema.typeName;
const MOUNT_FAILURE_TYPE = MountFailureSchema.typeName;
const DIAGNOSTIC_TYPE = DiagnosticSchema.typeName;

/**
 * The snapshot message for a reducer snapshot. Every field of the seed's snapshot is mapped;
 * `null` is unset. `diagnosticsTotal` is the reducer's count when it keeps one (more than 100
 * diagnostics recorded) and the length of `diagnostics` otherwise. `updatedAt` (an ISO string)
 * becomes a Timestamp with millisecond precision. Keys the seed's snapshot does not have (a
 * foreign snapshot file's extras) have no field and are left out.
 */
export function snapshotToProto(s: SessionSnapshot): Snapshot {
  const snapshot: Snapshot = {
    $typeName: SNAPSHOT_TYPE,
    id: stringOf(s.id) ?? "",
    phase: stringOf(s.phase) ?? "",
    expectedVariants: uint32Of(s.expectedVariants) ?? 0,
    arrivedVariants: uint32Of(s.arrivedVariants) ?? 0,
    checkpointRevision: int64Of(s.checkpointRevision) ?? 0n,
    browserCheckpointRevision: int64Of(s.browserCheckpointRevision) ?? 0n,
    publicationCheckpointRevision: int64Of(s.publicationCheckpointRevision) ?? 0n,
    generationTimings: timingsOf(s.generationTimings),
    generationCanceled: s.generationCanceled === true,
    annotationArtifacts: artifactsOf(s.annotationArtifacts),
    mountedVariants: mountedVariantsOf(s.mountedVariants),
    mountFailures: mountFailuresOf(s.mountFailures),
    diagnostics: diagnosticsOf(s.diagnostics),
    diagnosticsTotal: uint64Of(s.diagnosticsTotal) ?? BigInt(Array.isArray(s.diagnostics) ? s.diagnostics.length : 0),
  };
  // Optional fields are assigned only when set, so the message has exactly the properties
  // `create` would give it.
  let v: unknown;
  if ((v = stringOf(s.pageUrl)) !== undefined) snapshot.pageUrl = v as string;
  if ((v = stringOf(s.sourceFile)) !== undefined) snapshot.sourceFile = v as string;
  if ((v = stringOf(s.previewFile)) !== undefined) snapshot.previewFile = v as string;
  if ((v = stringOf(s.previewMode)) !== undefined) snapshot.previewMode = v as string;
  if ((v = uint32Of(s.visibleVariant)) !== undefined) snapshot.visibleVariant = v as number;
  if ((v = objectOf(s.paramValues)) !== undefined) snapshot.paramValues = v as JsonObject;
  if ((v = uint64Of(s.pendingEventSeq)) !== undefined) snapshot.pendingEventSeq = v as bigint;
  if ((v = objectOf(s.pendingEvent)) !== undefined) snapshot.pendingEvent = v as JsonObject;
  if (s.deliveryLease !== null && s.deliveryLease !== undefined) snapshot.deliveryLease = toProtoValue(s.deliveryLease as JsonValue);
  if ((v = stringOf(s.activeOwner)) !== undefined) snapshot.activeOwner = v as string;
  if ((v = objectOf(s.sourceMarkers)) !== undefined) snapshot.sourceMarkers = v as JsonObject;
  if ((v = stringOf(s.fallbackMode)) !== undefined) snapshot.fallbackMode = v as string;
  if ((v = stringOf(s.generationPhase)) !== undefined) snapshot.generationPhase = v as string;
  if ((v = doubleOf(s.generationCompletedAt)) !== undefined) snapshot.generationCompletedAt = v as number;
  if (s.variantPlan !== null && s.variantPlan !== undefined) snapshot.variantPlan = toProtoValue(s.variantPlan as JsonValue);
  if ((v = doubleOf(s.generationCanceledAt)) !== undefined) snapshot.generationCanceledAt = v as number;
  if ((v = stringOf(s.cancelReason)) !== undefined) snapshot.cancelReason = v as string;
  if ((v = stringOf(s.renderState)) !== undefined) snapshot.renderState = v as string;
  if ((v = isoToTimestamp(s.updatedAt)) !== undefined) snapshot.updatedAt = v as Timestamp;
  if (Array.isArray(s.detectorWaivers)) snapshot.detectorWaivers = toProtoListValue(s.detectorWaivers as JsonValue[]);
  if ((v = stringOf(s.message)) !== undefined) snapshot.message = v as string;
  return snapshot;
}

/** A number, or a number parsed from a numeric string (JavaScript's `Number`); finite only. */
function numberOf(value: unknown): number | undefined {
  if (typeof value === "number") return Number.isFinite(value) ? value : undefined;
  if (typeof value === "string" && value.trim() !== "") {
    const n = Number(value);
    return Number.isFinite(n) ? n : undefined;
  }
  return undefined;
}

function stringOf(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}

function doubleOf(value: unknown): number | undefined {
  return numberOf(value);
}

function uint32Of(value: unknown): number | undefined {
  const n = numberOf(value);
  // `+ 0` turns -0 into 0, which is what the wire would make of it anyway.
  return n !== undefined && Number.isInteger(n) && n >= 0 && n <= 0xffffffff ? n + 0 : undefined;
}

function int64Of(value: unknown): bigint | undefined {
  const n = numberOf(value);
  return n !== undefined && Number.isSafeInteger(n) ? BigInt(n) : undefined;
}

function uint64Of(value: unknown): bigint | undefined {
  const n = numberOf(value);
  return n !== undefined && Number.isSafeInteger(n) && n >= 0 ? BigInt(n) : undefined;
}

function objectOf(value: unknown): JsonObject | undefined {
  return value !== null && typeof value === "object" && !Array.isArray(value) ? (value as JsonObject) : undefined;
}

function timingsOf(value: unknown): { [phase: string]: GenerationTiming } {
  const out: { [phase: string]: GenerationTiming } = {};
  const timings = objectOf(value);
  if (timings === undefined) return out;
  for (const phase of Object.keys(timings)) {
    const timing: GenerationTiming = { $typeName: TIMING_TYPE };
    const entry = objectOf(timings[phase]);
    if (entry !== undefined) {
      const at = doubleOf(entry.at);
      if (at !== undefined) timing.at = at;
      const durationMs = doubleOf(entry.durationMs);
      if (durationMs !== undefined) timing.durationMs = durationMs;
    }
    setOwn(out, phase, timing);
  }
  return out;
}

function artifactsOf(value: unknown): AnnotationArtifact[] {
  if (!Array.isArray(value)) return [];
  const out: AnnotationArtifact[] = [];
  for (const item of value) {
    const artifact = objectOf(item);
    if (artifact === undefined) continue;
    out.push({ $typeName: ARTIFACT_TYPE, type: stringOf(artifact.type) ?? "", path: stringOf(artifact.path) ?? "" });
  }
  return out;
}

function mountedVariantsOf(value: unknown): number[] {
  if (!Array.isArray(value)) return [];
  const out: number[] = [];
  for (const item of value) {
    const variant = uint32Of(item);
    if (variant !== undefined) out.push(variant);
  }
  return out;
}

function mountFailuresOf(value: unknown): MountFailure[] {
  if (!Array.isArray(value)) return [];
  const out: MountFailure[] = [];
  for (const item of value) {
    const failure = objectOf(item);
    if (failure === undefined) continue;
    const message: MountFailure = {
      $typeName: MOUNT_FAILURE_TYPE,
      variant: uint32Of(failure.variant) ?? 0,
      at: doubleOf(failure.at) ?? 0,
    };
    const url = stringOf(failure.url);
    if (url !== undefined) message.url = url;
    const error = stringOf(failure.error);
    if (error !== undefined) message.error = error;
    out.push(message);
  }
  return out;
}

/**
 * Each diagnostic's `error`, and its other keys grouped in `fields` with their JSON types. A
 * diagnostic whose `error` is not a string (a foreign snapshot file) keeps the raw value in
 * `fields.error`, so nothing it said is lost.
 */
function diagnosticsOf(value: unknown): Diagnostic[] {
  if (!Array.isArray(value)) return [];
  const out: Diagnostic[] = [];
  for (const item of value) {
    const diagnostic = objectOf(item);
    if (diagnostic === undefined) continue;
    const error = stringOf(diagnostic.error);
    const message: Diagnostic = { $typeName: DIAGNOSTIC_TYPE, error: error ?? "" };
    let fields: JsonObject | undefined;
    for (const key of Object.keys(diagnostic)) {
      if (key === "error" && error !== undefined) continue;
      const field = diagnostic[key];
      // The seed writes `revision: event.revision` even when it is undefined; JSON drops it.
      if (field === undefined) continue;
      fields ??= {};
      setOwn(fields, key, typeof field === "number" && !Number.isFinite(field) ? null : field);
    }
    if (fields !== undefined) message.fields = fields;
    out.push(message);
  }
  return out;
}
