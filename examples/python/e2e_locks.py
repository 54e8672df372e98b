"""The lock scenarios of e2e.py: Hold, leases and request ids, a Hold released through Release,
(``e2e.py lock_watch``) WatchLocks and its resume after a lag, and (``e2e.py spellings``) one file
locked through several spellings of its path."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc

# berth_client first: importing it puts the generated stubs (berth.*) on sys.path.
from berth_client import Berth, BerthError, lock_path
from berth.locks.v1 import lock_service_pb2
from berth.locks.v1.lock_service_pb2 import LockEventKind
from e2e_common import NARROW_WINDOW, OWN_CONNECTIONS, emit, events_until, expect_error, until_caught_up, wait_for


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
