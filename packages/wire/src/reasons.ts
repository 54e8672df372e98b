/**
 * Every `google.rpc.ErrorInfo.reason` berth sends, one table per service, as the services' protos
 * list them (the comment over each service: "the one list of reasons and what to do"). A reason is
 * what a program branches on; the services type their refusals with these tables and the clients
 * compare with them, so a reason misspelt on either side is a compile error, and `reasons.test.ts`
 * holds the tables to the protos' lists.
 */

/**
 * The reasons any call of any service may end with: refused for its bytes, its token or the
 * server's state, and the defaults of codes that carry no case of their own.
 */
export const ANY_CALL_REASONS = {
  /** A field breaks a rule: the message names it (BadRequest). */
  INVALID_FIELD: "INVALID_FIELD",
  /** The body is not the method's message in its format. */
  MALFORMED_REQUEST: "MALFORMED_REQUEST",
  /** A field this server does not know (metadata `field`). */
  UNKNOWN_FIELD: "UNKNOWN_FIELD",
  /** A request message is over the service's limit (metadata `limitBytes`). */
  MESSAGE_TOO_LARGE: "MESSAGE_TOO_LARGE",
  /** The answer would be over the service's message limit. */
  RESPONSE_TOO_LARGE: "RESPONSE_TOO_LARGE",
  /** Compressed with an encoding the server does not accept (metadata `encoding`, `supported`). */
  UNSUPPORTED_ENCODING: "UNSUPPORTED_ENCODING",
  /** A message has the compressed flag but the request declares no encoding. */
  COMPRESSED_WITHOUT_ENCODING: "COMPRESSED_WITHOUT_ENCODING",
  /** No `authorization: Bearer` header where the service has a token. */
  TOKEN_MISSING: "TOKEN_MISSING",
  /** A bearer token that is not the service's. */
  TOKEN_INVALID: "TOKEN_INVALID",
  /** The service is stopping: retry on the restarted one. */
  SHUTTING_DOWN: "SHUTTING_DOWN",
  /** The caller cancelled. */
  CANCELLED: "CANCELLED",
  /** The caller's deadline passed. */
  DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
  /** A bug: see the service's log. */
  INTERNAL: "INTERNAL",
  /** The state directory is not writable. */
  STATE_READ_ONLY: "STATE_READ_ONLY",
  /** The state directory's file system is full. */
  DISK_FULL: "DISK_FULL",
  /** No file descriptor left, or the connection is over the service's share. */
  TOO_MANY_OPEN_FILES: "TOO_MANY_OPEN_FILES",
  /** A request id (or idempotency key) named another request. */
  IDEMPOTENCY_KEY_REUSED: "IDEMPOTENCY_KEY_REUSED",
  /** A watch fell behind: watch again from where its lagged message says. */
  WATCHER_LAGGED: "WATCHER_LAGGED",
  /** (`--store etcd`) etcd is out of reach. */
  ETCD_UNAVAILABLE: "ETCD_UNAVAILABLE",
  /** (`--store etcd`) etcd refused berth's credentials or their rights. */
  ETCD_AUTH: "ETCD_AUTH",
  /** (`--store etcd`) anything else etcd answered. */
  ETCD_ERROR: "ETCD_ERROR",
} as const;

/** The reasons of `berth.sessions.v1.SessionService`, beside those of any call. */
export const SESSIONS_REASONS = {
  ...ANY_CALL_REASONS,
  /** An event over the service's size limit (GetLimits). */
  EVENT_TOO_LARGE: "EVENT_TOO_LARGE",
  /** More events in one call than the service takes (GetLimits). */
  TOO_MANY_EVENTS: "TOO_MANY_EVENTS",
  /** (`--store etcd`) the append is over what one etcd request carries. */
  REQUEST_TOO_LARGE: "REQUEST_TOO_LARGE",
  /** (`--store etcd`) the append has more operations than etcd's `--max-txn-ops`. */
  ETCD_TOO_MANY_TXN_OPS: "ETCD_TOO_MANY_TXN_OPS",
  /** The session has no journal. */
  SESSION_NOT_FOUND: "SESSION_NOT_FOUND",
  /** The session (or the seqs, or the append a key names) was deleted. */
  SESSION_DELETED: "SESSION_DELETED",
  /** The fencing token is not the lock's current one: the writer lost the lock. */
  FENCE_REJECTED: "FENCE_REJECTED",
  /** The expected seq or state no longer holds: re-read, redo, append again. */
  SEQ_CONFLICT: "SEQ_CONFLICT",
  /** `from_seq` is past the journal's end. */
  SEQ_OUT_OF_RANGE: "SEQ_OUT_OF_RANGE",
  /** (`--store etcd`) etcd's quota is full. */
  ETCD_NO_SPACE: "ETCD_NO_SPACE",
  /** Another writer's append came first while this one was being written: retry as is. */
  APPEND_OVERTAKEN: "APPEND_OVERTAKEN",
  /** (`--store etcd`) a journal entry in etcd does not decode. */
  JOURNAL_DAMAGED: "JOURNAL_DAMAGED",
} as const;

/** The reasons of `berth.locks.v1.LockService`, beside those of any call. */
export const LOCKS_REASONS = {
  ...ANY_CALL_REASONS,
  /** The lock stayed held for the whole wait (LockHeld). */
  WAIT_EXHAUSTED: "WAIT_EXHAUSTED",
  /** The file's queue of waiters is full. */
  TOO_MANY_WAITERS: "TOO_MANY_WAITERS",
  /** (`--store etcd`) etcd's quota is full. */
  ETCD_NO_SPACE: "ETCD_NO_SPACE",
  /** (`--store etcd`) the instance's etcd lease ended while the request waited. */
  ETCD_LEASE_LOST: "ETCD_LEASE_LOST",
  /** The file system refused otherwise (a lock file, the fencing state, resolving the path). */
  STORAGE_UNAVAILABLE: "STORAGE_UNAVAILABLE",
} as const;

/** The reasons of `berth.budget.v1.BudgetService`, beside those of any call. */
export const BUDGET_REASONS = {
  ...ANY_CALL_REASONS,
  /** An Admit message sent out of turn. */
  OUT_OF_TURN: "OUT_OF_TURN",
  /** This Admit stream was resumed by another with its `request_id`: follow that one. */
  ADMIT_RESUMED: "ADMIT_RESUMED",
  /** The need exceeds the whole budget. */
  IMPOSSIBLE: "IMPOSSIBLE",
  /** GetFleet on a budget not started with `--store etcd`. */
  FLEET_NEEDS_ETCD: "FLEET_NEEDS_ETCD",
  /** The queue is full. */
  QUEUE_FULL: "QUEUE_FULL",
  /** Waited the whole wait. */
  WAIT_EXHAUSTED: "WAIT_EXHAUSTED",
  /** The reservation is gone (released, expired). */
  RESERVATION_NOT_FOUND: "RESERVATION_NOT_FOUND",
} as const;

/**
 * Reasons berth's code gives that never reach the wire: refusals at a service's start (in the log
 * and the exit message), and cases a handler answers otherwise.
 */
export const UNSENT_REASONS = {
  /** A combination of settings this store does not support (the message names the setting). */
  UNSUPPORTED_SETTINGS: "UNSUPPORTED_SETTINGS",
  /** (`--store etcd`) another budget instance already publishes its machine under this name. */
  MACHINE_NAME_TAKEN: "MACHINE_NAME_TAKEN",
  /** (`--store etcd`) a watch asked for a revision etcd compacted: the watcher ends lagged instead. */
  ETCD_COMPACTED: "ETCD_COMPACTED",
  /** A running entry to renew is gone: KeepAlive answers it as `alive = false`. */
  RUNNING_NOT_FOUND: "RUNNING_NOT_FOUND",
} as const;

export type AnyCallReason = (typeof ANY_CALL_REASONS)[keyof typeof ANY_CALL_REASONS];
export type SessionsReason = (typeof SESSIONS_REASONS)[keyof typeof SESSIONS_REASONS];
export type LocksReason = (typeof LOCKS_REASONS)[keyof typeof LOCKS_REASONS];
export type BudgetReason = (typeof BUDGET_REASONS)[keyof typeof BUDGET_REASONS];
export type UnsentReason = (typeof UNSENT_REASONS)[keyof typeof UNSENT_REASONS];

/** Every reason a berth service gives. */
export type BerthReason = SessionsReason | LocksReason | BudgetReason | UnsentReason;
