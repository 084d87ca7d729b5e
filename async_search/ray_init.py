"""Starting or joining Ray, for every module that uses it, and stopping what was started.

``ray.init`` replaces the caller's SIGTERM handler with one of its own
(``sys.exit(15)``) for good; ``ensure_ray`` gives a handler the caller installed back
once Ray has started. A start cut short (Ctrl-C, SIGTERM, an error) leaves nothing
behind: what it had started (GCS, raylet, agents, workers) is ended before the
exception goes on.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading

from async_search import process_tree
from async_search.extras import import_extra
from async_search.machine import usable_cpus


#: Seconds to wait for a TCP connection to an explicit cluster address: ray.init retries
#: an address where nothing listens for minutes.
CONNECT_TIMEOUT_S = 3.0


def check_reachable(address: str | None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raises ConnectionError (one line, naming ``address``) when ``address``, a
    ``host:port`` or ``ray://host:port``, takes no TCP connection within ``timeout``
    seconds, or does not speak gRPC there (HTTP/2: Ray's GCS and its client server
    both do; another service, Ray's dashboard say, would keep ray.init retrying for
    minutes); None, ``auto``, ``local`` and a ``ray://`` address without a port are
    left to ray.init. Anything else (a bare name, a port that is no number) raises
    ConnectionError too: ray.init would refuse it only when a run starts, after the
    runs before it."""
    if address is None:
        return
    target = address.strip()
    client = target.startswith("ray://")
    if client:
        target = target[len("ray://"):]
    elif target.lower() in ("auto", "local"):
        return
    host, colon, port = target.rpartition(":")
    if client and target and (not colon or (target.startswith("[")
                                            and target.endswith("]"))):
        return  # the Ray client's default port (after a name, or an IPv6 literal)
    if not colon or not host or not port.isdigit():
        raise ConnectionError(f"{address!r} is no Ray cluster address: give host:port "
                              f"(the GCS, port 6379 by default), ray://host:port, auto "
                              f"or local")
    host = host.strip("[]")  # an IPv6 literal
    try:
        connection = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError, OverflowError) as e:  # OverflowError: port > 65535
        raise ConnectionError(f"no Ray cluster answers at {address} (a TCP connection "
                              f"failed within {timeout:g} s: {e})") from None
    with connection:
        if not _speaks_http2(connection):
            raise ConnectionError(
                f"no Ray cluster answers at {address}: something listens there but does "
                f"not speak gRPC within {timeout:g} s (is it the cluster's GCS port, "
                f"6379 by default, and not its dashboard's?)")


#: HTTP/2's client preface and an empty SETTINGS frame: a gRPC server answers with a
#: SETTINGS frame of its own (type 4, the fourth byte of its header).
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _speaks_http2(connection: socket.socket) -> bool:
    """Whether the peer answers HTTP/2's preface with a frame header of a SETTINGS
    frame (within the connection's timeout)."""
    try:
        connection.sendall(_HTTP2_HELLO)
        header = b""
        while len(header) < 9:
            chunk = connection.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:  # a timeout, or the connection dropped
        return False
    return header[3] == 4


def ensure_ray(address: str | None = None):
    """Ray, initialised: joins ``address`` if given, else starts Ray on this machine with
    its CPUs and no dashboard (unless Ray is already running in this process).

    Raises:
        ConnectionError: the cluster at ``address`` could not be joined; without
            ``RAY_AUTH_MODE=token`` the message says how to join one that uses token
            authentication.

    Example:
        Ray starts on this machine (seconds, so not run in the tests):

        ```python
        ray = ensure_ray()
        shutdown_ray()
        ```
    """
    ray = import_extra("ray", "the Ray backend")

    if ray.is_initialized():
        return ray
    check_reachable(address)  # seconds, not ray.init's minutes of retries
    in_main_thread = threading.current_thread() is threading.main_thread()
    caller_handler = signal.getsignal(signal.SIGTERM) if in_main_thread else None
    before = {p.pid for p in process_tree.descendants()}
    try:
        if address is not None:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=usable_cpus(), include_dashboard=False, log_to_driver=False)
    except BaseException as e:  # cut short: end what it started before going on
        _undo_start(ray, before)
        refused = (ConnectionError,
                   getattr(ray.exceptions, "AuthenticationError", ConnectionError))
        if address is not None and isinstance(e, refused) and (
                os.environ.get("RAY_AUTH_MODE", "").lower() != "token"):
            raise ConnectionError(f"{e}. If the cluster uses Ray's token authentication "
                                  f"(Ray 2.60 turns it on by default), set "
                                  f"RAY_AUTH_MODE=token here and give this process the "
                                  f"cluster's token (~/.ray/auth_token, RAY_AUTH_TOKEN or "
                                  f"RAY_AUTH_TOKEN_PATH)") from e
        raise
    finally:
        if callable(caller_handler):  # the caller's own handler, not Ray's sys.exit
            signal.signal(signal.SIGTERM, caller_handler)
    return ray


def _undo_start(ray, before: set) -> None:
    try:
        ray.shutdown()
    except Exception:  # a half-made connection may not shut down cleanly; the processes
        pass           # are ended below all the same
    # Ray's processes (its binaries and scripts live in its package), and with them
    # everything they started; never another process this one started meanwhile.
    home = os.path.dirname(ray.__file__)
    started = [p for p in process_tree.descendants() if p.pid not in before
               and home in process_tree.command_line(p)]
    process_tree.end_processes(started, grace_s=0.0)


def shutdown_ray() -> None:
    """Stops a Ray that this process started (every process of it, waited for), or
    leaves a cluster it joined; does nothing when Ray is not running here (or was never
    imported)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    try:
        ray.shutdown(wait_for_processes=True)
    except TypeError:  # a Ray older than the keyword
        ray.shutdown()
