"""The Python side of berth's polyglot end-to-end test (test/python.test.ts drives it).

It talks to started services through berth_client, step by step. After each step it prints one
JSON line, ``{"step": NAME, ...facts}``, on stdout; where the other side has to act (append a live
entry, inspect a lock, hold or free the budget) it waits for ``{"go": NAME}`` on stdin. A failure
prints ``{"step": "failed", "error": ...}`` and exits 1.

Environment: BERTH_SESSIONS_URL, BERTH_BUDGET_URL, BERTH_TOKEN (the sessions service's token),
BERTH_PYTHON_STUBS (the generated stubs), BERTH_E2E_LOCK_FILE (the file to lock; the service lets one
request wait per file).
`e2e.py lag` runs only the lag-and-resume scenarios, of a session watch and of a watch of every
session (against a service with a small --watch-buffer).
`e2e.py spellings` locks BERTH_E2E_LOCK_FILE (relative to its working directory) when told, while
the other side takes the same file through other spellings.
`e2e.py resolve` reads a JSON array of cases on stdin (``{"env": {...}, "sessions_url", "budget_url",
"token", "token_file"}``) and prints, for each, where ``Berth(...)`` finds the services and its
token in that environment, or the error: the client side of the discovery table's test.
`e2e.py budget` runs the budget's errors (each code with its ErrorInfo reason), request ids, pages
and limits, against a budget service whose queue holds nobody (--max-queue=0).
`e2e.py lock_watch` watches the locks of files in BERTH_E2E_LOCK_DIR (one file, every file, a resume
from a revision, progress), then stops reading while 100 files are taken and freed, against a
sessions service with a small --watch-buffer: the watch resumes by itself, missing nothing.
`e2e.py budget_watch` watches the budget through an admission that queues (the budget holds 4G) and
the machine's samples, then stops reading while 150 reservations come and go, against a budget
service with --watch-buffer 4.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc

from berth_client import Berth, BerthError, error_from_rpc, event, lock_path, start, to_dict
from berth.budget.v1 import budget_pb2, budget_service_pb2
from berth.budget.v1.budget_service_pb2 import BudgetEventKind
from berth.locks.v1 import lock_service_pb2
from berth.locks.v1.lock_service_pb2 import LockEventKind
from berth.sessions.v1 import session_service_pb2
import error_details_pb2  # google.rpc's, generated beside berth's stubs (on sys.path once berth_client is imported)

SESSION = "py-e2e"
# Connections of their own (a local subchannel pool), so that a watcher that stops reading cannot
# hold up another client's calls.
OWN_CONNECTIONS = [("grpc.use_local_subchannel_pool", 1)]
# A reader whose transport holds little (a 16 KiB window that does not grow): it is the service, not
# grpcio's buffers, that sees it fall behind once a few dozen changes go unread.
NARROW_WINDOW = OWN_CONNECTIONS + [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16384)]


def emit(step: str, **facts) -> None:
    print(json.dumps({"step": step, **facts}), flush=True)


def wait_for(name: str) -> None:
    for line in sys.stdin:
        if json.loads(line).get("go") == name:
            return
    raise RuntimeError(f"stdin closed while waiting for {name!r}")


def expect_error(call, code: grpc.StatusCode) -> BerthError:
    try:
        call()
    except BerthError as error:
        if error.code != code:
            raise AssertionError(f"expected {code.name}, got {error}") from error
        return error
    raise AssertionError(f"expected {code.name}, the call succeeded")


def ms(timestamp) -> int:
    return timestamp.ToMilliseconds()


def token_steps(berth: Berth) -> None:
    token = os.environ.pop("BERTH_TOKEN")
    try:
        with Berth() as anonymous:
            missing = expect_error(lambda: anonymous.snapshot(SESSION), grpc.StatusCode.UNAUTHENTICATED)
            health = anonymous.health()  # health needs no token
        with Berth(token="not-the-token") as wrong:
            expect_error(lambda: wrong.snapshot(SESSION), grpc.StatusCode.UNAUTHENTICATED)
    finally:
        os.environ["BERTH_TOKEN"] = token
    limits = berth.sessions.GetLimits(session_service_pb2.GetLimitsRequest(), timeout=10)  # a raw stub call carries it too
    emit("token", without=missing.code.name, without_reason=missing.reason, message=missing.message, health_without=health, with_token=berth.health(), raw_stub_max_page_size=limits.max_page_size)


def append_steps(berth: Berth) -> None:
    first = berth.append(SESSION, "generate", {"pageUrl": "/pricing", "count": 3}, extra={"prompt": "make it pop"}, idempotency_key="gen-1", expected_seq=0)
    retry = berth.append(SESSION, "generate", {"pageUrl": "/pricing", "count": 3}, extra={"prompt": "make it pop"}, idempotency_key="gen-1")
    reused = expect_error(lambda: berth.append(SESSION, "generate", {"pageUrl": "/pricing", "count": 4}, idempotency_key="gen-1"), grpc.StatusCode.ALREADY_EXISTS)
    second = berth.append(SESSION, "agent_phase", {"phase": "planning", "at": 1700000000000}, expected_seq=first.seq)
    conflict = expect_error(lambda: berth.append(SESSION, "agent_phase", {"phase": "writing"}, expected_seq=first.seq), grpc.StatusCode.ABORTED)
    seq_conflict = conflict.detail(session_service_pb2.SeqConflict)
    key_reused = reused.detail(session_service_pb2.IdempotencyKeyReused)
    snapshot = berth.snapshot(SESSION)
    journal = berth.read_journal(SESSION)
    emit(
        "appended",
        seqs=[first.seq, second.seq],
        duplicate=retry.duplicate,
        duplicate_seq=retry.seq,
        conflict_current_seq=seq_conflict.current_seq if seq_conflict else None,
        conflict_reason=conflict.reason,
        conflict_facts=conflict.facts,
        reused_reason=reused.reason,
        reused_seqs=[key_reused.first_seq, key_reused.last_seq] if key_reused else None,
        phase=snapshot.phase,
        page_url=snapshot.page_url,
        expected_variants=snapshot.expected_variants,
        generation_phase=snapshot.generation_phase,
        pending_event=to_dict(snapshot.pending_event),
        journal=[{"seq": e.seq, "type": e.type, "idempotency_key": e.idempotency_key, "integrity": session_service_pb2.EntryIntegrity.Name(e.integrity), "event": to_dict(e.event)} for e in journal],
    )


def watch_steps(berth: Berth) -> None:
    with berth.watch(SESSION, from_seq=1, include_snapshot=True, progress_interval=0.1, timeout=30) as watch:
        backlog = []
        for item in watch:
            if item.caught_up is not None:
                emit("watch_caught_up", backlog=backlog, last_seq=item.caught_up.last_seq, snapshot_phase=item.snapshot.phase if item.snapshot else None)
                break
            backlog.append(item.seq)
        # Idle: the service says so every 100 ms; then the other side appends one entry.
        for item in watch:
            if item.progress is not None:
                emit("watch_progress", last_seq=item.progress.last_seq, send_time_ms=ms(item.progress.send_time))
                break
        for item in watch:
            if item.entry is not None:
                emit("watch_live", seq=item.seq, type=item.entry.type, live=item.live, snapshot_phase=item.snapshot.phase if item.snapshot else None, event=to_dict(item.entry.event))
                break


def sessions_steps(berth: Berth) -> None:
    """Paging, reading with an end, deleting."""
    for n in range(5):
        berth.append(f"py-page-{n}", "generate", {"pageUrl": f"/{n}"})
    listed = [snapshot.id for snapshot in berth.list_sessions(page_size=2)]
    read = berth.read_journal(SESSION, from_seq=1, limit=1)
    empty = berth.read_journal(SESSION, from_seq=read.last_seq + 1)
    deleted_at = berth.delete("py-page-0", expected_seq=1, idempotency_key="py-delete-1")
    repeated_delete = berth.delete("py-page-0", expected_seq=1, idempotency_key="py-delete-1")
    emit(
        "sessions",
        listed=listed,
        read=[e.seq for e in read],
        read_end={"last_seq": read.last_seq, "next_seq": read.next_seq, "more": read.more},
        empty_read={"entries": len(empty), "next_seq": empty.next_seq, "more": empty.more},
        deleted_at=deleted_at,
        repeated_delete=repeated_delete,
        after_delete=[snapshot.id for snapshot in berth.list_sessions() if snapshot.id.startswith("py-page-")],
        snapshot_after_delete=berth.snapshot("py-page-0") is None,
        # Created again, the session continues after the deleted one's last seq (evaluated last).
        reborn_seq=berth.append("py-page-0", "generate", {"pageUrl": "/again"}).seq,
        limits={"max_page_size": berth.session_limits().max_page_size, "max_events_per_append": berth.session_limits().max_events_per_append},
    )


def sessions_watch_steps(berth: Berth) -> None:
    """A watch of every session started again from a revision it received: exactly the changes
    after it, then ``caught_up``."""
    names = [f"py-every-{os.getpid()}-{n}" for n in range(2)]
    with berth.watch_sessions(include_current=True, timeout=30) as every:
        for message in every:
            if message.WhichOneof("kind") == "caught_up":
                break
        berth.append(names[0], "generate", {"pageUrl": "/a"})
        berth.append(names[1], "generate", {"pageUrl": "/b"})
        berth.append(names[0], "steer", {"pageUrl": "/a"})
        changes = []
        for message in every:
            if message.WhichOneof("kind") == "change" and message.change.session_id in names:
                changes.append([names.index(message.change.session_id), message.change.last_seq, message.change.revision])
                if len(changes) == 3:
                    break
        watch_revision = every.revision
    with berth.watch_sessions(start_revision=changes[0][2], timeout=30) as again:
        replayed = []
        for message in again:
            kind = message.WhichOneof("kind")
            if kind == "caught_up":
                caught_up = [message.caught_up.revision, message.caught_up.reset]
                break
            if kind == "change" and message.change.session_id in names:
                replayed.append([names.index(message.change.session_id), message.change.last_seq, message.change.revision])
    emit("sessions_watch", changes=changes, watch_revision=watch_revision, replayed=replayed, caught_up=caught_up, again_revision=again.revision)


def session_refusals_steps(berth: Berth) -> None:
    """Each SessionService refusal as this client sees it: its gRPC code and ErrorInfo reason."""
    seen: dict = {}

    def refused(name: str, call) -> None:
        try:
            call()
        except BerthError as error:
            seen[name] = [error.code.name, error.reason]
            return
        except grpc.RpcError as error:  # a raw stub call
            failure = error_from_rpc(error)
            seen[name] = [failure.code.name, failure.reason]
            return
        seen[name] = ["OK", None]

    session = "py-refusals"
    berth.append(session, "generate", {"count": 1}, idempotency_key="k")
    sessions = berth.sessions
    refused("append bad id", lambda: berth.append("bad id", "steer", {}))
    refused("append too large", lambda: berth.append(session, "steer", {"pageUrl": "x" * (1024 * 1024)}))
    refused("append stale seq", lambda: berth.append(session, "steer", {}, expected_seq=9))
    refused("append exists", lambda: berth.append(session, "steer", {}, expected_state="no_session"))
    refused("append missing", lambda: berth.append("py-refusals-none", "steer", {}, expected_state="exists"))
    refused("append key reused", lambda: berth.append(session, "steer", {}, idempotency_key="k"))
    lease = berth.acquire(os.environ["BERTH_E2E_LOCK_FILE"], owner="py-fence")
    lease.release()
    refused("append fence", lambda: berth.append(session, "steer", {}, fence=(lease.lease.file, lease.fencing_token)))
    refused("appends too many", lambda: berth.append_many(session, [event("steer")] * 10_001))
    refused("get missing", lambda: sessions.GetSnapshot(session_service_pb2.GetSnapshotRequest(session_id="py-none"), timeout=10))
    refused("list bad token", lambda: sessions.ListSessions(session_service_pb2.ListSessionsRequest(page_token="nope!"), timeout=10))
    refused("flush missing", lambda: sessions.FlushSnapshot(session_service_pb2.FlushSnapshotRequest(session_id="py-none"), timeout=10))
    refused("delete missing", lambda: berth.delete("py-none"))
    refused("delete stale seq", lambda: berth.delete(session, expected_seq=5))
    refused("read missing", lambda: berth.read_journal("py-none"))
    refused("read past the end", lambda: berth.read_journal(session, from_seq=3))
    refused("watch progress too often", lambda: next(berth.watch(session, progress_interval=0.05, timeout=10)))
    refused("watch all bad resume", lambda: next(sessions.WatchSessions(session_service_pb2.WatchSessionsRequest(resume_from={"a b": 1}), timeout=10)))
    with berth.watch(session, timeout=30) as watch:
        for item in watch:
            if item.caught_up is not None:
                break
        berth.delete(session)
        refused("watch deleted", lambda: next(watch))
    emit("session_refusals", seen=seen)


def lock_steps(berth: Berth) -> None:
    file = os.environ["BERTH_E2E_LOCK_FILE"]
    limits = berth.lock_limits()
    emit("lock_limits", default_ttl_ms=limits.default_ttl.ToMilliseconds(), max_ttl_ms=limits.max_ttl.ToMilliseconds(), max_wait_ms=limits.max_wait.ToMilliseconds(), heartbeat_ms=limits.heartbeat_interval.ToMilliseconds(), max_waiters_per_file=limits.max_waiters_per_file, max_owner_length=limits.max_owner_length)
    with berth.lock(file, owner="python", max_wait=10) as lease:
        busy = expect_error(lambda: berth.acquire(file, owner="python-probe", max_wait=0.2), grpc.StatusCode.RESOURCE_EXHAUSTED)
        held = busy.detail(lock_service_pb2.LockHeld)
        emit(
            "lock_held",
            file=lease.file,
            owner=lease.owner,
            fencing_token=lease.fencing_token,
            busy_reason=busy.reason,
            busy_retry_after=busy.retry_after,
            busy_owner=held.owner if held else None,
            busy_kind=lock_service_pb2.HolderKind.Name(held.kind) if held else None,
            busy_fencing_token=held.fencing_token if held else None,
            busy_waited_ms=held.waited.ToMilliseconds() if held else None,
        )
        # The other side inspects the lock and queues a waiter of its own, then says go: the
        # file's queue (room for one here) is full, so one more is refused at once.
        wait_for("release_lock")
        crowded = expect_error(lambda: berth.acquire(file, owner="python-crowd", max_wait=5), grpc.StatusCode.RESOURCE_EXHAUSTED)
        emit("lock_crowded", reason=crowded.reason, retry_after=crowded.retry_after, lock_held=crowded.detail(lock_service_pb2.LockHeld) is not None, message=crowded.message)
    emit("lock_released")


def lease_steps(berth: Berth) -> None:
    file = "src/lease.css"
    request_id = str(uuid.uuid4())
    lease = berth.acquire(file, owner="python-lease", ttl=5, request_id=request_id)
    # The retry of a call whose answer was lost: the same lease, not a second place in the queue.
    again = berth.acquire(file, owner="python-lease", ttl=5, max_wait=0, request_id=request_id)
    time.sleep(0.05)  # so that the renewed expiry is visibly later
    renewal = lease.keep_alive()
    both = berth.keep_alive(lease.lease.lease_token, "never-granted")
    bad_id = expect_error(lambda: berth.acquire(file, owner="python-lease", request_id="not a valid id"), grpc.StatusCode.INVALID_ARGUMENT)
    released = lease.release()
    after = lease.keep_alive()
    emit(
        "lease",
        file=lease.lease.file,
        same_lease=again.lease.lease_token == lease.lease.lease_token and again.fencing_token == lease.fencing_token,
        alive=renewal.alive,
        renewed_later=renewal.expire_time.ToMilliseconds() > lease.lease.expire_time.ToMilliseconds(),
        several=[r.alive for r in both],
        bad_code=bad_id.code.name,
        bad_reason=bad_id.reason,
        bad_field=bad_id.field,
        bad_violations=[v.field for d in bad_id.details if type(d).__name__ == "BadRequest" for v in d.field_violations],
        released=released,
        alive_after_release=after.alive,
    )

    # A Hold's lease released through Release by its owner (the token went only to it) ends the
    # Hold OK: the hold object sees the lock lost, with no error.
    held = berth.lock(file, owner="python-hold", max_wait=10)
    hold_lease = held.__enter__()
    released_hold = berth.locks.Release(lock_service_pb2.ReleaseRequest(lease_token=hold_lease.lease_token), timeout=10).released
    lost = held.wait_lost(10)
    error = held.lost_error
    held.release()
    emit("hold_released", released=released_hold, lost=lost, code=error.code.name if error else None, reason=error.reason if error else None, message=error.message if error else None)


def admit_steps(berth: Berth) -> None:
    impossible = expect_error(lambda: berth.admit([start("huge", memory="100G")], owner="python impossible").__enter__(), grpc.StatusCode.FAILED_PRECONDITION)
    refusal = impossible.detail(budget_pb2.Refusal)
    emit(
        "refused",
        kind=budget_pb2.RefusalKind.Name(refusal.kind) if refusal else None,
        settings=list(refusal.settings) if refusal else [],
        gates=[budget_pb2.Gate.Name(r.gate) for r in refusal.reasons] if refusal else [],
        facts=impossible.facts,
        reason=impossible.reason,
    )

    emit("ready_to_admit")
    wait_for("budget_held")
    updates = []

    def on_queued(queued) -> None:
        updates.append(queued)
        if len(updates) == 1:
            emit("admit_queued", position=queued.position, gates=[budget_pb2.Gate.Name(r.gate) for r in queued.wait_for], wait_for_text=queued.wait_for_text, wait_expire_ms=ms(queued.wait_expire_time))

    with berth.admit([start("web", memory="2G", cpu=1)], owner="python admit", max_wait=30, on_queued=on_queued, timeout=60) as admission:
        reservation = admission.reservation
        emit("admitted", id=reservation.id, owner=reservation.owner, start_memory=reservation.start.memory_bytes, queued_updates=len(updates), waited_ms=admission.admitted.waited.ToMilliseconds())
        updated = admission.started("web", pid=os.getpid(), memory="1G", cpu=0.5)
        emit("admit_started", running_id=updated.running.id, running_name=updated.running.name, running_pid=updated.running.pid, running_memory=updated.running.cost.memory_bytes, start_memory_left=updated.reservation.start.memory_bytes)
        wait_for("running_seen")
    emit("admit_released", released=admission.released, id=reservation.id)


def reserve_steps(berth: Berth) -> None:
    reservation = berth.reserve([start("api", memory="1G", cpu=0.5)], owner="python reserve", ttl=5, max_wait=10)
    first_expiry = ms(reservation.reservation.expire_time)
    emit("reserved", id=reservation.id, owner=reservation.reservation.owner, memory=reservation.reservation.start.memory_bytes, expires_ms=first_expiry)
    wait_for("reservation_seen")
    time.sleep(0.05)  # so that the renewed expiry is visibly later
    renewal = reservation.keep_alive()
    released = reservation.release()
    released_again = reservation.release()
    after = reservation.keep_alive()
    emit("reserve_done", alive=renewal.alive, renewed_later=ms(renewal.expire_time) > first_expiry, released=released, released_again=released_again, alive_after_release=after.alive)


def invalid_argument_steps(berth: Berth) -> None:
    bad_id = expect_error(lambda: berth.append("bad/id", "generate", {"pageUrl": "/"}), grpc.StatusCode.INVALID_ARGUMENT)
    struct = next((to_dict(d) for d in bad_id.details if type(d).__name__ == "Struct"), None)
    bad_size = expect_error(lambda: berth.check([start("web", memory="lots")]), grpc.StatusCode.INVALID_ARGUMENT)
    bad_event = expect_error(lambda: berth.append(SESSION, event("generate", {"pageUrl": "/"}, extra={"pageUrl": "/other"})), grpc.StatusCode.INVALID_ARGUMENT)
    emit(
        "invalid_argument",
        code=bad_id.code.name,
        message=bad_id.message,
        field=bad_id.field,
        reason=bad_id.reason,
        violations=[v.field for d in bad_id.details if type(d).__name__ == "BadRequest" for v in d.field_violations],
        rule=bad_id.facts.get("rule"),
        struct_detail=struct,
        budget_field=bad_size.field,
        event_field=bad_event.field,
    )


def budget_steps() -> None:
    """The budget's errors, each with its code and ErrorInfo reason (and RetryInfo where a retry can
    succeed), request ids on Reserve and RegisterRunning, the lists page by page, and the limits."""

    def error(e: BerthError) -> dict:
        refusal = e.detail(budget_pb2.Refusal)
        info = e.detail(error_details_pb2.ErrorInfo)
        return {
            "code": e.code.name,
            "reason": e.reason,
            "domain": info.domain if info else None,
            "retry": e.retry_after is not None and e.retry_after > 0,
            "refusal": budget_pb2.RefusalKind.Name(refusal.kind) if refusal else None,
            "field": e.field,
        }

    with Berth(timeout=15) as berth:
        limits = berth.budget_limits()
        emit("limits", default_ttl_s=limits.default_ttl.seconds, max_ttl_s=limits.max_ttl.seconds, max_wait_s=limits.max_wait.seconds, max_queue=limits.max_queue, max_owner_length=limits.max_owner_length)

        errors = {}
        errors["impossible"] = error(expect_error(lambda: berth.reserve([start("huge", memory="100G")], "py huge"), grpc.StatusCode.FAILED_PRECONDITION))
        holder = berth.reserve([start("holder", memory="3G", cpu=1)], "py holder", request_id="py-holder")
        again = berth.reserve([start("holder", memory="3G", cpu=1)], "py holder", request_id="py-holder")
        # The same id for another request: refused, the same code and reason as a reused append key.
        errors["request_id_reused"] = error(expect_error(lambda: berth.reserve([start("holder", memory="2G", cpu=1)], "py holder", request_id="py-holder"), grpc.StatusCode.ALREADY_EXISTS))
        errors["queue_full"] = error(expect_error(lambda: berth.reserve([start("late", memory="2G")], "py late"), grpc.StatusCode.RESOURCE_EXHAUSTED))
        errors["wait_exhausted"] = error(expect_error(lambda: berth.reserve([start("now", memory="2G")], "py now", max_wait=0), grpc.StatusCode.RESOURCE_EXHAUSTED))
        errors["invalid_field"] = error(expect_error(lambda: berth.reserve([start("x", memory="1G")], "py x", ttl=7200), grpc.StatusCode.INVALID_ARGUMENT))
        errors["bad_request_id"] = error(expect_error(lambda: berth.reserve([start("x", memory="1G")], "py x", request_id="no spaces"), grpc.StatusCode.INVALID_ARGUMENT))

        # RegisterRunning with a request id: the repeat answers the same entry, counted once.
        first = berth.register_running("py-svc", memory="256M", cpu=0, reservation_id=holder.id, request_id="py-svc-1")
        repeat = berth.register_running("py-svc", memory="256M", cpu=0, reservation_id=holder.id, request_id="py-svc-1")
        running = list(berth.list_running(page_size=1))
        state = berth.state(page_size=1)
        emit(
            "request_ids",
            same_reservation=again.id == holder.id,
            same_entry=first.running.id == repeat.running.id,
            running_count=state.running_count,
            start_left=repeat.reservation.start.memory_bytes,
        )
        emit("pages", running=[r.name for r in running], reservations=[r.owner for r in berth.list_reservations(page_size=1)], queue=[q.owner for q in berth.list_queue()], reservation_count=state.reservation_count, all_reservations=len(berth.state(page_size=1, all_pages=True).reservations))

        berth.stop_running(first.running.id)
        holder.release()
        errors["reservation_not_found"] = error(expect_error(lambda: berth.register_running("py-svc", reservation_id=holder.id), grpc.StatusCode.NOT_FOUND))
        errors["release_build_gone"] = error(expect_error(lambda: _rpc_release_build(berth, holder.id), grpc.StatusCode.NOT_FOUND))

        # An Admit message out of turn (build_done before admitted), on the raw stub.
        def out_of_turn() -> None:
            try:
                for _ in berth.budget.Admit(iter([budget_service_pb2.AdmitRequest(build_done=budget_service_pb2.BuildDone())]), timeout=15):
                    pass
            except grpc.RpcError as e:
                raise error_from_rpc(e) from None

        errors["out_of_turn"] = error(expect_error(out_of_turn, grpc.StatusCode.INVALID_ARGUMENT))
        emit("budget_errors", **errors)


def _rpc_release_build(berth: Berth, reservation_id: str) -> None:
    try:
        berth.budget.ReleaseBuild(budget_service_pb2.ReleaseBuildRequest(reservation_id=reservation_id), timeout=15)
    except grpc.RpcError as e:
        raise error_from_rpc(e) from None


def lag_steps() -> None:
    """A watcher that stops reading is ended by the service (WatcherLagged); SessionWatch resumes it."""
    session = f"py-lag-{os.getpid()}"
    # Own connections (a local subchannel pool), so the stalled watch cannot hold up the appends.
    own = [("grpc.use_local_subchannel_pool", 1)]
    with Berth(timeout=15, channel_options=own) as writer, Berth(timeout=15, channel_options=own) as reader:
        writer.append(session, "generate", {"pageUrl": "/"})
        total = 1
        with reader.watch(session, include_snapshot=True, timeout=60) as watch:
            seqs = []
            for item in watch:
                if item.caught_up is not None:
                    break
                seqs.append(item.seq)
            # Stop reading while far more than the service's watch buffer is appended.
            for batch in range(16):
                writer.append_many(session, [event("steer", {"pageUrl": f"/p{batch}-{n}-".ljust(300, "x")}) for n in range(50)])
                total += 50
            resumed = 0
            for item in watch:
                resumed += 1 if item.resumed else 0
                if item.entry is not None:
                    seqs.append(item.seq)
                if seqs and seqs[-1] == total:
                    break
        emit("lag", resumed=resumed, contiguous=seqs == list(range(1, total + 1)), received=len(seqs), total=total)

        # A watch of every session that stops reading: resumed from the last seq it saw of each
        # session, so the service describes again only the sessions that moved since.
        idle, busy = f"py-lag-idle-{os.getpid()}", [f"py-lag-busy-{os.getpid()}-{n}" for n in range(3)]
        writer.append(idle, "generate", {"pageUrl": "/"})
        for name in busy:
            writer.append(name, "generate", {"pageUrl": "/"})
        with reader.watch_sessions(include_current=True, include_snapshot=True, timeout=60) as every:
            for message in every:
                if message.WhichOneof("kind") == "caught_up":
                    break
            known_before = dict(every.last_seqs)
            # Stop reading while far more changes than the watch buffer are made, many at once (the
            # service's group commit makes them durable together: the watcher gets them in one go).
            appends = 600
            for wave in range(0, appends, 60):
                calls = [
                    writer.sessions.AppendEvent.future(session_service_pb2.AppendEventRequest(session_id=busy[n % 3], event=event("steer", {"pageUrl": f"/q{n}"})), timeout=15)
                    for n in range(wave, wave + 60)
                ]
                for call in calls:
                    call.result()
            expected = {name: 1 + len(range(i, appends, 3)) for i, name in enumerate(busy)}
            described_again: set = set()
            describing = False
            resumes_seen = 0
            while any(every.last_seqs.get(name) != seq for name, seq in expected.items()):
                message = next(every)
                if every.resumes != resumes_seen:
                    # A resumed stream: what comes before its caught_up describes sessions again.
                    resumes_seen = every.resumes
                    describing = True
                kind = message.WhichOneof("kind")
                if kind == "caught_up":
                    describing = False
                elif kind == "change" and describing:
                    described_again.add(message.change.session_id)
        emit(
            "lag_all",
            resumes=every.resumes,
            knew_idle=known_before.get(idle),
            described_again=sorted(described_again),
            last_seqs={name: every.last_seqs.get(name) for name in [idle, *busy]},
            expected={idle: 1, **expected},
        )


def until_caught_up(watch, describe) -> tuple:
    """The events a watch sends before its caught_up, each as ``describe`` puts it, and the
    caught_up's revision."""
    described = []
    for message in watch:
        if message.WhichOneof("kind") == "caught_up":
            return described, message.caught_up.revision
        described.append(describe(message))
    raise AssertionError("the watch ended before caught_up")


def events_until(watch, describe, kind: str, owner: str) -> list:
    """The events a watch sends up to the first ``kind`` of ``owner``, each as ``describe`` puts it
    (``[kind, owner, ...]``)."""
    out = []
    for message in watch:
        if message.WhichOneof("kind") == "event":
            out.append(describe(message))
            if out[-1][:2] == [kind, owner]:
                return out
    raise AssertionError(f"the watch ended before {kind} {owner}")


def lock_event(message) -> list:
    """A LockEvent as [kind, owner, file's name, position, fencing token, revision]."""
    e = message.event
    return [LockEventKind.Name(e.kind).removeprefix("LOCK_EVENT_KIND_"), e.owner, os.path.basename(e.file), e.position, e.fencing_token, e.revision]


def lock_watch_steps() -> None:
    """WatchLocks of one file and of every file through a grant, a waiter, a release that hands the
    lock on and the last release; progress; a watch again from a revision replays the same."""
    lock_dir = os.environ["BERTH_E2E_LOCK_DIR"]
    file, other = os.path.join(lock_dir, "watched.css"), os.path.join(lock_dir, "held.css")
    with Berth(timeout=15) as berth, ThreadPoolExecutor(1) as pool:
        held = berth.acquire(other, owner="py-held")
        with berth.watch_locks(include_current=True, progress_interval=0.1, timeout=60) as every, berth.watch_locks(file, timeout=60) as one:
            described, start_revision = until_caught_up(every, lock_event)
            opened = next(one)  # sent also without include_current: where the watch starts
            lease = berth.acquire(file, owner="py-holder")
            waiting = pool.submit(lambda: berth.acquire(file, owner="py-waiter", max_wait=30))
            events = events_until(one, lock_event, "WAITER_JOINED", "py-waiter")
            lease.release()
            events += events_until(one, lock_event, "GRANTED", "py-waiter")
            handed_on = waiting.result(timeout=30)
            handed_on.release()
            events += events_until(one, lock_event, "RELEASED", "py-waiter")
            of_every = [e for e in events_until(every, lock_event, "RELEASED", "py-waiter") if e[2] == "watched.css"]
            progress = next(m for m in every if m.WhichOneof("kind") == "progress")
            with berth.watch_locks(file, start_revision=start_revision, timeout=60) as again:
                replayed = events_until(again, lock_event, "RELEASED", "py-waiter")
        held.release()
        emit(
            "lock_watch",
            described=described,
            opened_revision=opened.caught_up.revision,
            opened_reset=opened.caught_up.reset,
            start_revision=start_revision,
            events=events,
            tokens=[lease.fencing_token, handed_on.fencing_token],
            every_same=of_every == events,
            replayed_same=replayed == events,
            progress_revision=progress.progress.revision,
            watch_revision=every.revision,
        )


def lock_lag_steps() -> None:
    """A watch of every lock that stops reading while 100 files are taken and freed (-> WATCHER_LAGGED
    with a --watch-buffer of fewer changes), then reads on until the marker lock taken last: every
    change once, in order, replayed from the revision the lag names (a reset to the current state,
    where the service could no longer replay them, is reported as one)."""
    lock_dir = os.environ["BERTH_E2E_LOCK_DIR"]
    files = [os.path.join(lock_dir, f"lag-{n:03d}-" + "x" * 180 + ".ts") for n in range(100)]
    marker = os.path.join(lock_dir, "lag-marker.ts")
    owner = "py-lag-" + "o" * 240
    with Berth(timeout=15, channel_options=OWN_CONNECTIONS) as writer, Berth(timeout=15, channel_options=NARROW_WINDOW) as reader:
        with reader.watch_locks(timeout=120) as watch:
            next(watch)  # caught_up: watching
            for file in files:
                writer.acquire(file, owner=owner).release()
            held = writer.acquire(marker, owner="py-lag-marker")
            seen, view, reset = [], {}, False
            for message in watch:
                kind = message.WhichOneof("kind")
                if kind == "caught_up" and message.caught_up.reset:
                    reset = True
                    if marker in view:
                        break
                elif kind == "event":
                    event = message.event
                    if event.kind in (LockEventKind.LOCK_EVENT_KIND_CURRENT_HOLDER, LockEventKind.LOCK_EVENT_KIND_CURRENT_WAITER):
                        view[event.file] = event.owner  # a reset's description of the current state
                    else:
                        seen.append((event.file, LockEventKind.Name(event.kind), event.revision))
                        if event.file == marker:
                            break
            held.release()
        expected = [(file, kind) for file in files for kind in ("LOCK_EVENT_KIND_GRANTED", "LOCK_EVENT_KIND_RELEASED")]
        changes = [(file, kind) for file, kind, _ in seen if file != marker]
        revisions = [revision for _, _, revision in seen]
        emit(
            "lock_lag",
            resumes=watch.resumes,
            reset=reset,
            received=len(changes),
            in_order=changes == expected[: len(changes)],
            complete=changes == expected and seen[-1][0] == marker,
            revisions_growing=all(b > a for a, b in zip(revisions, revisions[1:])),
            view_held=sorted(os.path.basename(file) for file in view),
        )


def budget_event(message) -> list:
    """A BudgetEvent as [kind, owner (a running entry's name), revision]."""
    e = message.event
    subject = e.WhichOneof("subject")
    who = e.running.name if subject == "running" else getattr(e, subject).owner if subject in ("request", "reservation") else ""
    return [BudgetEventKind.Name(e.kind).removeprefix("BUDGET_EVENT_KIND_"), who, e.revision]


def budget_watch_steps() -> None:
    """WatchBudget through an admission that queues behind a reservation and is admitted once it is
    released; progress; a watch again from a revision replays the same; WatchMachine resumed after
    a sample."""
    with Berth(timeout=15) as berth, ThreadPoolExecutor(1) as pool:
        with berth.watch_budget(include_current=True, progress_interval=0.1, timeout=60) as watch:
            described, start_revision = until_caught_up(watch, budget_event)
            blocker = berth.reserve([start("blocker", memory="3G", cpu=1)], "py-blocker")
            admission = berth.admit([start("web", memory="2G", cpu=1)], owner="py-admit", max_wait=30, timeout=60)
            admitted = pool.submit(admission.wait)
            events = events_until(watch, budget_event, "REQUEST_QUEUED", "py-admit")
            blocker.release()
            events += events_until(watch, budget_event, "REQUEST_ADMITTED", "py-admit")
            admitted.result(timeout=30)
            admission.release()
            events += events_until(watch, budget_event, "RESERVATION_RELEASED", "py-admit")
            progress = next(m for m in watch if m.WhichOneof("kind") == "progress")
            with berth.watch_budget(start_revision=start_revision, timeout=60) as again:
                replayed = events_until(again, budget_event, "RESERVATION_RELEASED", "py-admit")
                caught_up = next(again)
        with berth.watch_machine(timeout=60) as machine:
            first, second = next(machine), next(machine)
        with berth.watch_machine(start_revision=first.revision, timeout=60) as machine:
            resumed = next(machine)
        emit(
            "budget_watch",
            described=described,
            start_revision=start_revision,
            events=events,
            replayed_same=replayed == events,
            replay_caught_up=[caught_up.WhichOneof("kind"), caught_up.caught_up.revision, caught_up.caught_up.reset],
            progress_revision=progress.progress.revision,
            watch_revision=watch.revision,
            machine=[first.revision, second.revision, resumed.revision, resumed.reset, machine.revision],
            machine_memory=resumed.machine.total_bytes,
        )


def budget_lag_steps() -> None:
    """A watch of the budget that stops reading while 150 reservations are made and released
    (-> WATCHER_LAGGED with --watch-buffer 4), then reads on: every change once, in order."""
    count = 150
    owners = [f"py-lag-{n:03d}-" + "o" * 200 for n in range(count)]
    with Berth(timeout=15, channel_options=OWN_CONNECTIONS) as writer, Berth(timeout=15, channel_options=NARROW_WINDOW) as reader:
        with reader.watch_budget(include_current=True, timeout=120) as watch:
            until_caught_up(watch, budget_event)
            for owner in owners:
                writer.reserve([start("lag", memory="1M", cpu=0)], owner).release()
            seen, reset = [], False
            for message in watch:
                kind = message.WhichOneof("kind")
                if kind == "caught_up" and message.caught_up.reset:
                    reset = True
                    break
                if kind == "event":
                    seen.append(budget_event(message))
                    if seen[-1][0] == "RESERVATION_RELEASED" and seen[-1][1] == owners[-1]:
                        break
        expected = [[kind, owner] for owner in owners for kind in ("RESERVATION_MADE", "RESERVATION_RELEASED")]
        revisions = [revision for _, _, revision in seen]
        emit(
            "budget_lag",
            resumes=watch.resumes,
            reset=reset,
            received=len(seen),
            exact=[[kind, owner] for kind, owner, _ in seen] == expected,
            revisions_consecutive=all(b == a + 1 for a, b in zip(revisions, revisions[1:])),
        )


def spellings_steps() -> None:
    """Tries (`{"go": "try LABEL"}` → step `tried LABEL`), holds (`hold` → `held`) and releases
    (`release` → `released`) the lock of BERTH_E2E_LOCK_FILE until told `done`."""
    file = os.environ["BERTH_E2E_LOCK_FILE"]
    with Berth(timeout=15) as berth:
        emit("spellings_ready", cwd=os.getcwd(), sent=lock_path(file))
        held = None
        for line in sys.stdin:
            go = json.loads(line).get("go", "")
            if go.startswith("try "):
                try:
                    with berth.acquire(file, owner="python-try", max_wait=0) as lease:
                        emit(f"tried {go[4:]}", acquired=True, file=lease.lease.file)
                except BerthError as error:
                    lock_held = error.detail(lock_service_pb2.LockHeld)
                    emit(f"tried {go[4:]}", acquired=False, code=error.code.name, file=lock_held.file if lock_held else None, holder=lock_held.owner if lock_held else None)
            elif go == "hold":
                held = berth.lock(file, owner="python", max_wait=10)
                lease = held.__enter__()
                emit("held", file=lease.file, fencing_token=lease.fencing_token)
            elif go == "release" and held is not None:
                held.__exit__(None, None, None)
                emit("released")
            elif go == "done":
                return


def tour() -> None:
    with Berth(timeout=15) as berth:
        token_steps(berth)
        append_steps(berth)
        watch_steps(berth)
        sessions_steps(berth)
        sessions_watch_steps(berth)
        session_refusals_steps(berth)
        lock_steps(berth)
        lease_steps(berth)
        admit_steps(berth)
        reserve_steps(berth)
        invalid_argument_steps(berth)


def resolve_cases() -> None:
    cases = json.load(sys.stdin)
    saved = dict(os.environ)
    for case in cases:
        os.environ.clear()
        os.environ.update(case.get("env", {}))
        try:
            with Berth(case.get("sessions_url"), case.get("budget_url"), token=case.get("token"), token_file=case.get("token_file")) as berth:
                answer = {"sessions": berth.sessions_url, "budget": berth.budget_url, "token": berth.token}
        except ValueError as error:
            answer = {"error": str(error)}
        finally:
            os.environ.clear()
            os.environ.update(saved)
        print(json.dumps(answer), flush=True)


def main() -> int:
    if sys.argv[1:] == ["resolve"]:
        resolve_cases()
        return 0
    try:
        if sys.argv[1:] == ["lag"]:
            lag_steps()
        elif sys.argv[1:] == ["spellings"]:
            spellings_steps()
        elif sys.argv[1:] == ["budget"]:
            budget_steps()
        elif sys.argv[1:] == ["lock_watch"]:
            lock_watch_steps()
            lock_lag_steps()
        elif sys.argv[1:] == ["budget_watch"]:
            budget_watch_steps()
            budget_lag_steps()
        else:
            tour()
        emit("done")
        return 0
    except Exception as error:  # report, then fail: the test shows this line
        traceback.print_exc()
        emit("failed", error=f"{type(error).__name__}: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
