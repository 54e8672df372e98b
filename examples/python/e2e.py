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

The scenarios are in the modules beside this one: e2e_sessions.py, e2e_locks.py, e2e_budget.py
(what they share in e2e_common.py).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import grpc

from berth_client import Berth, event, start, to_dict
from e2e_budget import admit_steps, budget_lag_steps, budget_steps, budget_watch_steps, reserve_steps
from e2e_common import SESSION, emit, expect_error
from e2e_locks import lease_steps, lock_lag_steps, lock_steps, lock_watch_steps, spellings_steps
from e2e_sessions import append_steps, lag_steps, session_refusals_steps, sessions_steps, sessions_watch_steps, token_steps, watch_steps


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
