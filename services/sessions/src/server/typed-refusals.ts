/**
 * The store's refusals as the SessionService sends them: the same BerthError, with the proto's
 * typed detail first (IdempotencyKeyReused, SeqConflict, FenceRejected, WatcherLagged), beside the
 * ErrorInfo, Struct detail and header every BerthError gets; and the fence check an append runs.
 */
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import {
  ExpectedState,
  FenceRejectedSchema,
  IdempotencyKeyReusedSchema,
  SeqConflictSchema,
  WatcherLaggedSchema,
  type Fence,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { BerthError, invalidArgument, isBerthError } from "@berth/shared/errors";
import { checkPathInput } from "@berth/shared/safe-id";
import { berthErrorToConnect } from "@berth/shared/server/index";
import type { AppendOptions, AppendResult, ExpectedState as StoreExpectedState } from "../session-store.js";
import type { SessionStoreApi } from "../session-store-api.js";

/**
 * A fence's check, in two steps, supplied by the lock service. Called with the request's fence, it
 * checks the input (invalid_argument naming `fence.file` or `fence.fencing_token`) and makes the
 * path canonical, as every lock RPC does, so a fence matches its lock however the path is spelled.
 * The function it returns runs right before the append is sequenced and throws a BerthError
 * (reason FENCE_REJECTED) unless `token` is still the current fencing token of the file's lock
 * (details: `file` — the canonical path —, `currentToken`, null or 0 when nobody holds it).
 */
export type FenceCheck = (file: string, token: bigint) => () => void;

/** The ErrorInfo domain of this service's errors. */
export const SESSIONS_ERROR_DOMAIN = "berth.sessions";

export async function appendOrExplain(
  store: SessionStoreApi,
  sessionId: string,
  events: Record<string, unknown>[],
  options: AppendOptions,
): Promise<AppendResult> {
  try {
    return await store.append(sessionId, events, options);
  } catch (error) {
    if (isBerthError(error) && error.reason === "IDEMPOTENCY_KEY_REUSED") throw explainKeyReused(error, sessionId, options.idempotencyKey ?? "");
    // A store that checks the fence in its own write (etcd) refuses it from there.
    if (isBerthError(error) && error.reason === "FENCE_REJECTED" && options.fence !== undefined)
      throw fenceRejected(error, options.fence.file, options.fence.token);
    throw explainSeqConflict(error, sessionId, options.expectedSeq, options.expectedState);
  }
}

/** An ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED → the same error with its IdempotencyKeyReused detail. */
export function explainKeyReused(error: BerthError, sessionId: string, idempotencyKey: string): unknown {
  const details = error.details ?? {};
  return withTypedDetail(error, {
    desc: IdempotencyKeyReusedSchema,
    value: {
      sessionId,
      idempotencyKey,
      firstSeq: BigInt(numberOr(details.firstSeq, 0)),
      lastSeq: BigInt(numberOr(details.lastSeq, 0)),
    },
  });
}

/** An aborted SEQ_CONFLICT → the same error with its SeqConflict detail; anything else as it is. */
export function explainSeqConflict(error: unknown, sessionId: string, expectedSeq: number | undefined, expectedState: StoreExpectedState | undefined): unknown {
  if (!isBerthError(error) || error.reason !== "SEQ_CONFLICT") return error;
  return withTypedDetail(error, {
    desc: SeqConflictSchema,
    value: {
      sessionId,
      expectedSeq: BigInt(expectedSeq ?? 0),
      currentSeq: BigInt(numberOr(error.details?.currentSeq, 0)),
      expectedState: expectedState === "no_session" ? ExpectedState.NO_SESSION : expectedState === "exists" ? ExpectedState.EXISTS : ExpectedState.UNSPECIFIED,
    },
  });
}

/**
 * The store's fence hook for a request's fence: checked input, and the lock service's verdict as
 * FAILED_PRECONDITION FENCE_REJECTED with its FenceRejected detail (the writer lost its lock; a
 * retry cannot succeed until it holds the lock again).
 */
export function fenceChecker(fence: Fence, fenceCheck: FenceCheck | undefined): () => void {
  const file = checkPathInput(fence.file, "fence.file");
  const token = fence.fencingToken;
  if (token <= 0n) throw invalidArgument("fence.fencing_token", "must be a positive integer (the fencing token of your lease)");
  if (fenceCheck === undefined) {
    const error = new BerthError(
      "failed_precondition",
      "fence: this service cannot check fencing tokens (its lock service is not running), so the fence is rejected; nothing was written",
      { file, fencingToken: token, currentToken: 0 },
      { reason: "FENCE_REJECTED" },
    );
    throw fenceRejected(error, file, token);
  }
  const check = fenceCheck(file, token);
  return () => {
    try {
      check();
    } catch (error) {
      if (!isBerthError(error) || (error.code !== "aborted" && error.reason !== "FENCE_REJECTED")) throw error;
      throw fenceRejected(error, file, token);
    }
  };
}

export function fenceRejected(error: BerthError, file: string, token: bigint): ConnectError {
  const details = error.details ?? {};
  const { reason: _reason, ...facts } = details;
  const rejected = new BerthError("failed_precondition", error.message, facts, { reason: "FENCE_REJECTED" });
  return withTypedDetail(rejected, {
    desc: FenceRejectedSchema,
    value: {
      file: typeof details.file === "string" ? details.file : file,
      fencingToken: token,
      currentToken: BigInt(numberOr(details.currentToken, 0)),
    },
  });
}

/** A watcher that fell behind (the store's WATCHER_LAGGED) → the same error with its WatcherLagged detail. */
export function lagged(error: unknown, sessionId: string): unknown {
  if (!isBerthError(error) || error.reason !== "WATCHER_LAGGED") return error;
  const lastSeq = error.details?.lastSeq;
  const lastRevision = error.details?.lastRevision;
  const resumeFromSeq = sessionId !== "" && typeof lastSeq === "number" ? BigInt(lastSeq + 1) : 0n;
  const resumeFromRevision = sessionId === "" && typeof lastRevision === "number" ? BigInt(lastRevision) : 0n;
  return withTypedDetail(error, { desc: WatcherLaggedSchema, value: { sessionId, resumeFromSeq, resumeFromRevision } });
}

/** A detail as `new ConnectError` takes it (the type is not exported by connect). */
type OutgoingDetail = NonNullable<ConstructorParameters<typeof ConnectError>[3]>[number];

/**
 * A BerthError as the ConnectError the server would send (code, message, ErrorInfo, Struct detail,
 * details header) with a typed detail first, so clients that decode the proto's own message find it.
 */
function withTypedDetail<D extends DescMessage>(error: BerthError, detail: { desc: D; value: Omit<MessageShape<D>, "$typeName"> }): ConnectError {
  const base = berthErrorToConnect(error, SESSIONS_ERROR_DOMAIN);
  const details: OutgoingDetail[] = [detail as unknown as OutgoingDetail, ...(base.details as OutgoingDetail[])];
  return new ConnectError(base.rawMessage, base.code, base.metadata, details, error);
}

function numberOr(value: unknown, fallback: number): number | bigint {
  if (typeof value === "bigint") return value;
  if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0) return value;
  return fallback;
}
