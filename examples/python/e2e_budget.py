"""The budget scenarios of e2e.py: a refusal, Admit through a queue, Reserve, (``e2e.py budget``)
each error with its reason, request ids, pages and limits, and (``e2e.py budget_watch``)
WatchBudget and WatchMachine, and the budget watch's resume after a lag."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

# berth_client first: importing it puts the generated stubs (berth.*) on sys.path.
from berth_client import Berth, BerthError, error_from_rpc, start
from berth.budget.v1 import budget_pb2, budget_service_pb2
from berth.budget.v1.budget_service_pb2 import BudgetEventKind
import error_details_pb2  # google.rpc's, generated beside berth's stubs (on sys.path once berth_client is imported)
from e2e_common import NARROW_WINDOW, OWN_CONNECTIONS, emit, events_until, expect_error, ms, until_caught_up, wait_for


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
