"""What the scenarios of e2e.py share: the JSON line of each step, waiting for the other side's
go, an expected error, the connections of a watcher made to fall behind, and reading a watch."""

from __future__ import annotations

import json
import sys

import grpc

from berth_client import BerthError

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
