"""A five-minute tour of berth from Python, against the services `npm start` runs.

    npm start                                   # in one terminal: both services on 127.0.0.1
    examples/python/generate.sh                 # once: the stubs, into examples/python/berth_api
    /usr/bin/python3 examples/python/demo.py    # in another terminal

It uses the defaults (sessions on 127.0.0.1:7301, budget on 127.0.0.1:7302); the settings every
berth client reads (BERTH_SESSIONS_URL, BERTH_HOST and BERTH_*_PORT, the sockets, BERTH_TOKEN_FILE
or BERTH_TOKEN: docs/clients.md) point it elsewhere. It writes one session
(`demo-<time>`), takes and frees one lock on `src/app.css` under the directory it is run from (only
the lock, the file is not touched: the client sends the path made absolute, and the lease names
its canonical path), and admits and releases a small need.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402

from berth_client import Berth, BerthError, start, to_dict  # noqa: E402
from berth.budget.v1 import budget_pb2  # noqa: E402
from berth.locks.v1 import lock_service_pb2  # noqa: E402


def title(text: str) -> None:
    print(f"\n== {text}")


def size(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def main() -> int:
    berth = Berth()
    try:
        title(f"health: sessions at {berth.sessions_url}, budget at {berth.budget_url}")
        print("sessions:", berth.health(), "| budget:", berth.health(budget=True))
    except BerthError as error:
        print(f"berth is not reachable ({error}). Start it with `npm start` (or set BERTH_SESSIONS_URL / BERTH_BUDGET_URL).")
        return 69

    session = f"demo-{int(time.time())}"
    title(f"a session journal: {session}")
    first = berth.append(session, "generate", {"pageUrl": "/pricing", "count": 3}, extra={"prompt": "a calmer hero"}, expected_state="no_session", idempotency_key="demo-generate")
    print(f"appended seq {first.seq}: phase {first.snapshot.phase!r}, {first.snapshot.expected_variants} variants expected")
    again = berth.append(session, "generate", {"pageUrl": "/pricing", "count": 3}, extra={"prompt": "a calmer hero"}, idempotency_key="demo-generate")
    print(f"the same append retried with its key: duplicate={again.duplicate}, seq {again.seq}, nothing written")
    try:
        berth.append(session, "generate", {"pageUrl": "/about"}, idempotency_key="demo-generate")
    except BerthError as error:
        print(f"the key with another event is refused: {error.code.name} {error.reason}")
    berth.append(session, "agent_phase", {"phase": "planning"}, expected_seq=first.seq)
    try:
        berth.append(session, "agent_phase", {"phase": "writing"}, expected_seq=first.seq)
    except BerthError as error:
        print(f"a stale expected_seq is refused: {error.code.name} {error.reason}, the session is at {error.facts.get('currentSeq')}")

    title("watch it: the backlog, caught up, then live entries")
    watch = berth.watch(session, include_snapshot=True)
    caught_up = threading.Event()

    def follow() -> None:
        for item in watch:
            if item.caught_up is not None:
                print(f"  caught up at seq {item.caught_up.last_seq}")
                caught_up.set()
            elif item.entry is not None:
                phase = f" -> phase {item.snapshot.phase!r}" if item.snapshot is not None else ""
                print(f"  {'live' if item.live else 'backlog'} entry {item.seq}: {item.entry.type}{phase}")

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    caught_up.wait(10)
    berth.append(session, "variants_ready", {"sourceFile": "src/app.css", "arrivedVariants": 3})
    berth.append(session, "variant_mounted", {"variant": 2})
    time.sleep(0.5)
    watch.cancel()
    follower.join(5)
    snapshot = berth.snapshot(session)
    print("the snapshot now:", {k: v for k, v in to_dict(snapshot).items() if k in ("phase", "sourceFile", "arrivedVariants", "mountedVariants", "renderState")})
    print("active sessions (every page):", sum(1 for _ in berth.list_sessions()))
    read = berth.read_journal(session, limit=2)
    print(f"the journal's first {len(read)} entries; more from seq {read.next_seq}: {read.more} (last seq {read.last_seq})")

    title("a session deleted")
    scratch = f"{session}-scratch"
    berth.append(scratch, "generate", {"pageUrl": "/tmp"})
    print(f"deleted {scratch} at seq {berth.delete(scratch, expected_seq=1)}; its snapshot now: {berth.snapshot(scratch)}")

    title("a source lock, held for a with block")
    limits = berth.lock_limits()
    print(f"leases last {limits.default_ttl.seconds}s unless renewed; a request waits at most {limits.max_wait.seconds}s")
    with berth.lock("src/app.css", owner="demo.py", max_wait=30, on_waiting=lambda w: print(f"  waiting: position {w.position}, held by {w.holder.owner}")) as lease:
        print(f"holding {lease.file} with fencing token {lease.fencing_token}")
        print("Inspect says the holder is", berth.inspect("src/app.css").holder.owner)
        try:
            berth.acquire("src/app.css", owner="someone else", max_wait=0)
        except BerthError as error:
            held = error.detail(lock_service_pb2.LockHeld)
            print(f"a second taker, trying once, gets {error.code.name} {error.reason}: held by {held.owner!r} since {held.acquire_time.ToDatetime():%H:%M:%S} UTC; retry in {error.retry_after:g}s")
        # A write fenced by the lock: refused once the lock moves on (not here: we still hold it).
        berth.append(session, "steer", {"pageUrl": "/pricing"}, extra={"instructions": "less red"}, fence=(lease.file, lease.fencing_token))
        print("a fenced append went through")
    print("released at the end of the block; holder now:", berth.inspect("src/app.css").holder.owner or "nobody")

    title("the budget")
    state = berth.state()
    policy = state.policy
    print(f"budget {size(policy.memory_bytes)} memory / {policy.cpu:g} cpu, committed {size(state.committed.memory_bytes)} / {state.committed.cpu:g}, {state.queue_size} waiting, {state.reservation_count} reserved, {state.running_count} running")
    limits = berth.budget_limits()
    print(f"leases {limits.default_ttl.seconds}s unless asked (at most {limits.max_ttl.seconds}s), waits up to {limits.max_wait.seconds}s, at most {limits.max_queue} waiting")
    verdict = berth.check([start("web", memory="512M", cpu=0.5)])
    print("would 512M / 0.5 cpu fit now?", "yes" if verdict.fits else f"no: {verdict.wait_for_text}")
    try:
        berth.check([start("web", memory="lots")])
    except BerthError as error:
        print(f"a malformed need: {error.code.name} naming {error.field!r}: {error.facts.get('rule')}")
    try:
        with berth.admit([start("huge", memory="64T")], owner="demo impossible"):
            pass
    except BerthError as error:
        refusal = error.detail(budget_pb2.Refusal)
        print(f"an impossible need: {error.code.name} {error.reason}; change {', '.join(refusal.settings)}")

    title("admit on a stream: queued updates, admitted, started, released")

    def queued(update) -> None:
        # No eta when nothing predicts the wait: eta_basis says why.
        eta = f"eta {update.eta.ToMilliseconds() / 1000:.0f}s" if update.HasField("eta") else "no eta"
        print(f"  queued at {update.position}, {eta} ({update.eta_basis}): {update.wait_for_text}")

    try:
        with berth.admit([start("web", memory="512M", cpu=0.5)], owner="demo web", max_wait=60, on_queued=queued) as admission:
            print(f"admitted {admission.reservation.id} after {admission.admitted.waited.ToMilliseconds()} ms")
            updated = admission.started("web", pid=os.getpid(), memory="512M", cpu=0.5)
            print(f"'web' counted as running (entry {updated.running.id}) until this process exits")
        print("released")
    except BerthError as error:
        print(f"not admitted: {error}")

    title("reserve with a lease (for clients that cannot hold a stream)")
    try:
        request_id = f"demo-{uuid.uuid4()}"
        with berth.reserve([start("worker", memory="256M", cpu=0.25)], owner="demo lease", ttl=10, max_wait=60, request_id=request_id, auto_keep_alive=True) as reservation:
            print(f"reserved {reservation.id}, lease until {reservation.reservation.expire_time.ToDatetime():%H:%M:%S} UTC (renewed in the background)")
            retried = berth.reserve([start("worker", memory="256M", cpu=0.25)], owner="demo lease", ttl=10, request_id=request_id)
            print(f"the same request id again (a retry) answers the same reservation: {retried.id == reservation.id}")
            renewal = reservation.keep_alive()
            print(f"renewed by hand: alive={renewal.alive}, until {renewal.expire_time.ToDatetime():%H:%M:%S} UTC")
        print("released")
    except BerthError as error:
        print(f"not reserved: {error}")

    title("errors name the field")
    try:
        berth.append("not a valid id!", "generate", {})
    except BerthError as error:
        print(f"{error.code.name}: field {error.field!r}: {error.facts.get('rule')}")

    berth.close()
    print(f"\ndone: `berth sessions journal {session}` shows what this tour wrote.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except grpc.RpcError as error:  # a raw stub call outside berth_client's wrappers
        print(f"failed: {error}", file=sys.stderr)
        sys.exit(1)
