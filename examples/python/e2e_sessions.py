"""The sessions scenarios of e2e.py: the token, appends, a session's watch, paging and deleting,
the watch of every session, each refusal, and (``e2e.py lag``) watches resumed after a lag."""

from __future__ import annotations

import os

import grpc

# berth_client first: importing it puts the generated stubs (berth.*) on sys.path.
from berth_client import Berth, BerthError, error_from_rpc, event, to_dict
from berth.sessions.v1 import session_service_pb2
from e2e_common import SESSION, emit, expect_error, ms


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
