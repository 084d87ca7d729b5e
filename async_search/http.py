"""``python -m async_search.http``: serve a model over HTTP with the KServe v2 protocol.

    python -m async_search.http                      # the built-in seeded MLP as "mlp"
    python -m async_search.http --model mlp --port 8000 --max-batch-size 256
    python -m async_search.http --model mypackage.nets:make_net --name net

``--model`` is a built-in name (``mlp``: 16 FP32 inputs, 4 outputs) or
``module:function``, a function of no arguments that returns the model. The front binds
127.0.0.1 unless ``--host`` says otherwise, and runs until SIGINT or SIGTERM; then it
stops taking connections, drains the model's queue and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
from typing import Callable, Sequence

from async_search.servers.http_front import HttpFront
from async_search.servers.repository import ModelSource

__all__ = ["builtin_models", "main"]

log = logging.getLogger("async_search.http")


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
    return attr, getattr(importlib.import_module(module), attr)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m async_search.http", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp", help="built-in name or module:function")
    p.add_argument("--name", help="the served name (default: the model's)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--max-batch-size", type=int, default=256)
    p.add_argument("--max-delay", type=float, default=None)
    p.add_argument("--pipeline-depth", type=int, default=2)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--cache-capacity", type=int, default=0)
    p.add_argument("--max-body-bytes", type=int, default=16 * 2 ** 20)
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto",
                   help="event loop (auto: uvloop when installed)")
    return p


async def serve_forever(args: argparse.Namespace) -> None:
    name, factory = _factory(args.model)
    source = ModelSource(factory, max_batch_size=args.max_batch_size,
                         max_delay=args.max_delay, pipeline_depth=args.pipeline_depth,
                         num_workers=args.num_workers, cache_capacity=args.cache_capacity)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with HttpFront({args.name or name: source}, host=args.host, port=args.port,
                         max_body_bytes=args.max_body_bytes) as front:
        log.warning("serving %r on %s", args.name or name, front.url)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(format="%(name)s: %(message)s")
    loop_factory = None
    if args.loop != "asyncio":
        try:
            import uvloop
            loop_factory = uvloop.new_event_loop
        except ImportError:
            if args.loop == "uvloop":
                raise SystemExit("--loop uvloop: uvloop is not installed")
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve_forever(args))


if __name__ == "__main__":
    main()
