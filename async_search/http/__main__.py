"""``python -m async_search.http``: serve a model over HTTP with the KServe v2 protocol.

    python -m async_search.http                      # the built-in seeded MLP as "mlp"
    python -m async_search.http --model mlp --port 8000 --max-batch-size 256
    python -m async_search.http --model mypackage.nets:make_net --name net

``--model`` is a built-in name (``mlp``: 16 FP32 inputs, 4 outputs) or
``module:function``, a function of no arguments that returns the model. The front binds
127.0.0.1 unless ``--host`` says otherwise, and runs until SIGINT or SIGTERM; then it
drains, as Triton and KServe do: readiness answers 503 at once, new connections are
refused, bodies still arriving and new requests get a JSON 503 "the server is
stopping", and every request in progress gets its answer within ``--shutdown-timeout``
seconds or that 503 when they are up (a second signal ends them at once, on both
fronts); then it drains the model's queue and exits 0. A model that never returns holds
that exit one more ``--shutdown-timeout`` at most (none after a second signal): its
thread is left to end when it returns.

``--grpc-port PORT`` serves the same models with the KServe v2 gRPC protocol too
(``grpc_front.GrpcFront``, the ``grpc`` extra), on the same host; both fronts drain
at once, within the one grace.

Limits (defaults in brackets; see ``HttpLimits``): ``--max-body-bytes`` [16 MiB],
``--max-json-bytes`` [1 MiB: larger tensors go as binary], ``--max-connections`` [512,
and at most half of what ``ulimit -n`` leaves after the front's own descriptors and its
codec workers'], ``--keepalive-timeout`` [5 s idle],
``--read-timeout`` [30 s per body], ``--write-timeout`` [30 s: a client that takes no
byte of its answer for that long is dropped], ``--max-unsent-bytes`` [256 MiB of answers
that clients have not taken, in all: 503 beyond; the gRPC front has a budget of its
own, RESOURCE_EXHAUSTED beyond], ``--grpc-max-concurrent-rpcs`` [1024],
``--shutdown-timeout`` [5 s],
``--offload-bytes``
[256 KiB: JSON this large is parsed in ``--offload-workers`` [half the CPUs] processes],
``--max-workers`` [4 per CPU: the most ``num_workers`` a load request may ask for].
Load and unload are off unless ``--enable-repository`` or ``--repository-token TOKEN``
(or the environment variable ASYNC_SEARCH_REPOSITORY_TOKEN) is given; with a token, they
need the header ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
from typing import Callable, Sequence

from async_search.errors import ModelLoadError
from async_search.event_loops import loop_factory
from async_search.extras import extra_error, is_missing_extra

try:  # the http extra: without it, one line that names it (even for --help)
    from async_search.http.front import HttpFront, HttpLimits
except ModuleNotFoundError as e:
    if not is_missing_extra(e):  # a broken install: reported as it is
        raise
    raise SystemExit(extra_error(e, "python -m async_search.http")) from None
from async_search.http.repository import ModelSource


_log = logging.getLogger("async_search.http")


def builtin_models() -> dict:
    """Built-in model name -> factory."""
    from async_search.models import MLP

    return {"mlp": lambda: MLP((16,), hidden_sizes=(64, 64), output_size=4, seed=0)}


def _factory(spec: str) -> tuple[str, Callable]:
    builtin = builtin_models()
    if spec in builtin:
        return spec, builtin[spec]
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise SystemExit(f"--model must be a built-in model {sorted(builtin)} or "
                         f"module:function, got {spec!r}")
    try:
        return attr, getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:  # one line, as for the other flags
        raise SystemExit(f"python -m async_search.http: --model {spec!r}: "
                         f"{type(e).__name__}: {e}") from None


def _positive(text: str) -> int:
    """An integer >= 1, checked when the flags are read (a gRPC flag was checked only
    once the HTTP front served, or never without --grpc-port)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _port(text: str) -> int:
    """A port number, 0 to 65535 (checked before anything binds: a bad --grpc-port was
    refused only once the HTTP front served)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be an integer in [0, 65535], got "
                                         f"{text!r}")
    return port


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m async_search.http", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp", help="built-in name or module:function")
    p.add_argument("--name", help="the served name (default: the model's)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000, help="0 picks a free port")
    p.add_argument("--grpc-port", type=_port, default=None,
                   help="serve gRPC (KServe v2) on this port too; 0 picks a free port")
    p.add_argument("--grpc-max-concurrent-rpcs", type=_positive, default=1024,
                   help="gRPC RPCs in progress at once (one whose answer the client "
                        "has not taken counts); more get RESOURCE_EXHAUSTED")
    p.add_argument("--max-batch-size", type=int, default=256)
    p.add_argument("--max-delay", type=float, default=None)
    p.add_argument("--pipeline-depth", type=int, default=2)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--cache-capacity", type=int, default=0)
    limits = HttpLimits()
    p.add_argument("--max-body-bytes", type=int, default=16 * 2 ** 20)
    p.add_argument("--max-json-bytes", type=int, default=limits.max_json_bytes,
                   help="largest JSON part of an inference body; larger tensors go as "
                        "binary tensors")
    p.add_argument("--max-connections", type=int, default=limits.max_connections,
                   help="open connections at once (never more than half of what "
                        "ulimit -n leaves after the front's own descriptors)")
    p.add_argument("--keepalive-timeout", type=float, default=limits.keepalive_timeout,
                   help="seconds a connection may stay open with no request in progress")
    p.add_argument("--read-timeout", type=float, default=limits.read_timeout,
                   help="seconds a request body may take to arrive")
    p.add_argument("--write-timeout", type=float, default=limits.write_timeout,
                   help="seconds a client may take no byte of its answer before its "
                        "connection is dropped")
    p.add_argument("--max-unsent-bytes", type=int, default=limits.max_unsent_bytes,
                   help="bytes of answers that clients have not taken, over all "
                        "connections; an answer beyond gets 503")
    p.add_argument("--shutdown-timeout", type=float, default=limits.shutdown_timeout,
                   help="seconds requests in progress get on SIGTERM before they are "
                        "answered 503 (a second signal: at once)")
    p.add_argument("--offload-bytes", type=int, default=limits.offload_bytes,
                   help="JSON bodies this large are parsed in worker processes")
    p.add_argument("--offload-workers", type=int, default=limits.offload_workers)
    p.add_argument("--max-workers", type=int, default=None,
                   help="the most num_workers a load request may ask for (default: 4 "
                        "per CPU)")
    p.add_argument("--enable-repository", "--enable_repository", action="store_true",
                   help="serve load and unload to anyone who can connect")
    p.add_argument("--repository-token", "--repository_token",
                   default=os.environ.get("ASYNC_SEARCH_REPOSITORY_TOKEN"),
                   help="serve load and unload to requests with 'Authorization: Bearer "
                        "TOKEN' (default: $ASYNC_SEARCH_REPOSITORY_TOKEN)")
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto",
                   help="event loop (auto: uvloop when installed)")
    return p


def _refused(e: BaseException) -> SystemExit:
    """A flag's value the front cannot start with (or a port it cannot bind): one line."""
    return SystemExit(f"python -m async_search.http: {e}")


async def _serve_forever(args: argparse.Namespace) -> None:
    name, factory = _factory(args.model)
    if args.name is not None:  # --name '' is refused as a name, not taken for none
        name = args.name
    try:
        source = ModelSource(factory, max_batch_size=args.max_batch_size,
                             max_delay=args.max_delay, pipeline_depth=args.pipeline_depth,
                             num_workers=args.num_workers,
                             cache_capacity=args.cache_capacity)
        limits = HttpLimits(
            max_json_bytes=args.max_json_bytes, max_connections=args.max_connections,
            keepalive_timeout=args.keepalive_timeout, read_timeout=args.read_timeout,
            shutdown_timeout=args.shutdown_timeout, write_timeout=args.write_timeout,
            max_unsent_bytes=args.max_unsent_bytes, offload_bytes=args.offload_bytes,
            offload_workers=args.offload_workers, max_workers=args.max_workers)
        front = HttpFront({name: source}, host=args.host, port=args.port,
                          max_body_bytes=args.max_body_bytes, limits=limits,
                          enable_repository=args.enable_repository,
                          repository_token=args.repository_token or None)
    except (ValueError, TypeError) as e:
        raise _refused(e) from None
    stop = asyncio.Event()

    grpc_fronts: list = []  # the gRPC front, once it serves

    def on_signal() -> None:  # the first drains, the next ends the drains' grace
        if stop.is_set():
            front.end_grace()
            for grpc_front in grpc_fronts:
                grpc_front.end_grace()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    async with contextlib.AsyncExitStack() as http, contextlib.AsyncExitStack() as grpc:
        try:  # a port out of range or taken: one line, not a traceback
            await http.enter_async_context(front)
            _log.warning("serving %r on %s", name, front.url)
            if args.grpc_port is not None:  # the same repository: the same batches
                grpc_front = await grpc.enter_async_context(_grpc_front()(
                    front.repository, host=args.host, port=args.grpc_port,
                    max_message_bytes=args.max_body_bytes,
                    max_concurrent_rpcs=args.grpc_max_concurrent_rpcs,
                    max_unsent_bytes=args.max_unsent_bytes,
                    shutdown_timeout=limits.shutdown_timeout))
                grpc_fronts.append(grpc_front)
                _log.warning("serving %r on grpc://%s", name, grpc_front.address)
        except (OSError, OverflowError, ValueError, RuntimeError, ModelLoadError) as e:
            raise _refused(e) from None
        await stop.wait()
        _log.warning("stopping: requests in progress get %g s", limits.shutdown_timeout)
        # Both fronts drain at once: the grace is the flag's, not one grace per front.
        await asyncio.gather(grpc.aclose(), http.aclose())


def _grpc_front() -> type:
    """``GrpcFront``; without the grpc extra, a one-line exit that names it."""
    try:
        from async_search.http.grpc_front import GrpcFront
    except ModuleNotFoundError as e:
        if not is_missing_extra(e):  # a broken install: reported as it is
            raise
        raise _refused(extra_error(e, "--grpc-port")) from None
    return GrpcFront


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(format="%(name)s: %(message)s")
    if args.grpc_port is not None:
        _grpc_front()  # before the HTTP front serves: not a traceback after it does
    try:
        factory = loop_factory(args.loop != "asyncio", required=args.loop == "uvloop")
    except ImportError:
        raise SystemExit("--loop uvloop: uvloop is not installed") from None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve_forever(args))


if __name__ == "__main__":
    main()
