"""A two-node Ray cluster on one host, for the tests that need several machines.

The second machine is a network namespace joined to the host by a veth pair: the head
node (``ray start --head``) is bound to the host's end, the worker node (``ray start
--address``, run inside the namespace) to the other, so that Ray, and the direct sockets
between client tasks and server actors, really go between two addresses, and a link set
down is a partition. Both nodes use Ray's token authentication, with a token of their
own (a joining node needs ``RAY_AUTH_MODE=token``). Everything is torn down by process
id: each ``ray start`` and what it started, then the link and the namespace.

Needs root (a namespace, a link) and the ``ip`` tool; ``TwoNodeCluster.unavailable()``
says why not, for a skip. Drivers run in subprocesses (``run_driver``), so the test
process's own Ray session is never touched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from async_search import process_tree

__all__ = ["TwoNodeCluster", "ROOT"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_RAY = os.path.join(os.path.dirname(sys.executable), "ray")
#: Seconds a node may take to start (two cores, shared: Ray's start takes seconds).
START_S = 90.0
#: The head finds a node dead after about 5 s without an answer to its health checks
#: (Ray's defaults take about 30 s, longer than a test's run lasts after a raylet is
#: killed), and still outlasts the 3 s partition that must heal without a death.
HEALTH_CHECKS = json.dumps({"health_check_period_ms": 1000,
                            "health_check_timeout_ms": 1000,
                            "health_check_failure_threshold": 5})


class TwoNodeCluster:
    """A head node on the host and a worker node in a network namespace.

    Attributes:
        head_ip, worker_ip: the two ends of the veth pair.
        address: the head's GCS address (``run_searches(address=...)``).
        link: the host's end of the pair: ``ip link set <link> down`` cuts the worker
            node off (``partition``).
        env: what a driver needs to join (token authentication included).

    Example:
        >>> cluster = TwoNodeCluster()             # doctest: +SKIP
        >>> cluster.start(); cluster.run_driver({...}); cluster.stop()  # doctest: +SKIP
    """

    def __init__(self, worker_gpus: int = 1):
        tag = f"{os.getpid() % 100_000}"
        self.namespace = f"asr-{tag}"
        self.link, self._peer = f"asrh{tag}", f"asrw{tag}"
        subnet = 10 + os.getpid() % 200
        self.head_ip, self.worker_ip = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
        self.port = 20000 + os.getpid() % 20000
        self.address = f"{self.head_ip}:{self.port}"
        self._worker_gpus = worker_gpus
        # A short path: Ray's socket paths must fit in a sockaddr_un.
        self._dir = tempfile.mkdtemp(prefix="asr-rc-", dir="/tmp")
        token = os.path.join(self._dir, "auth_token")
        with open(token, "w") as f:
            f.write(secrets.token_hex(32))
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token,
                    "PYTHONPATH": ROOT, "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self._head: Optional[subprocess.Popen] = None
        self._worker: Optional[subprocess.Popen] = None
        self._logs: List = []
        self._netns = False

    @staticmethod
    def unavailable() -> Optional[str]:
        """Why no cluster can be built here (None: it can)."""
        if os.geteuid() != 0:
            return "needs root (a network namespace and a veth pair)"
        if shutil.which("ip") is None:
            return "needs the ip tool (iproute2)"
        if not os.path.exists(_RAY):
            return "needs the ray command beside this Python"
        probe = f"asr-probe-{os.getpid()}"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return f"cannot make a network namespace: {made.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    # -- up and down ---------------------------------------------------------------
    def start(self) -> None:
        """Builds the namespace and the link, then starts both nodes."""
        self._ip("netns", "add", self.namespace)
        self._netns = True
        self._ip("link", "add", self.link, "type", "veth", "peer", "name", self._peer)
        self._ip("link", "set", self._peer, "netns", self.namespace)
        self._ip("addr", "add", f"{self.head_ip}/24", "dev", self.link)
        self._ip("link", "set", self.link, "up")
        inside = ["netns", "exec", self.namespace, "ip"]
        self._ip(*inside, "addr", "add", f"{self.worker_ip}/24", "dev", self._peer)
        self._ip(*inside, "link", "set", self._peer, "up")
        self._ip(*inside, "link", "set", "lo", "up")
        self._head = self._ray_start("head", [
            "--head", f"--node-ip-address={self.head_ip}", f"--port={self.port}",
            "--num-cpus=2", "--num-gpus=0", '--resources={"asr_head": 1}',
            "--include-dashboard=false", f"--system-config={HEALTH_CHECKS}"])
        self.start_worker()

    def start_worker(self) -> None:
        """(Re)starts the worker node inside the namespace."""
        self._worker = self._ray_start("worker", [
            f"--address={self.address}", f"--node-ip-address={self.worker_ip}",
            "--num-cpus=2", f"--num-gpus={self._worker_gpus}",
            '--resources={"asr_worker": 1}'], netns=True)

    def _ray_start(self, name: str, arguments: List[str], netns: bool = False):
        log_path = os.path.join(self._dir, f"{name}-{len(self._logs)}.log")
        log = open(log_path, "w")
        self._logs.append(log)
        command = [_RAY, "start", *arguments, f"--temp-dir={self._dir}",
                   "--disable-usage-stats", "--block"]
        if netns:
            command = ["ip", "netns", "exec", self.namespace, *command]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env=self.env, cwd=ROOT, start_new_session=True)
        deadline = time.monotonic() + START_S
        while True:
            with open(log_path) as f:
                text = f.read()
            if "Ray runtime started" in text:
                return process
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start ({name}) did not start: exit "
                                   f"{process.poll()}; its log:\n{text[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Ends both nodes (every process each ``ray start`` started, by pid), then the
        link and the namespace, and removes the temporary folder."""
        for popen in (self._worker, self._head):
            self._end(popen)
        if self._netns:
            subprocess.run(["ip", "link", "del", self.link], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)
            self._netns = False
        for log in self._logs:
            log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    @staticmethod
    def _end(popen: Optional[subprocess.Popen]) -> None:
        if popen is None:
            return
        if popen.poll() is None:
            own = [p for p in process_tree.descendants() if p.pid == popen.pid]
            process_tree.end_processes(own + process_tree.descendants(popen.pid),
                                       grace_s=3.0)
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=10)

    # -- faults --------------------------------------------------------------------
    def worker_raylet(self) -> int:
        """The pid of the worker node's raylet."""
        for p in process_tree.descendants(self._worker.pid):
            if process_tree.command_line(p).split(" ")[0].endswith("/raylet"):
                return p.pid
        raise RuntimeError("the worker node has no raylet running")

    # -- drivers -------------------------------------------------------------------
    def run_driver(self, spec: dict, timeout: float = 240.0) -> dict:
        """Runs ``tests.backends.cluster_driver`` on ``spec`` in a subprocess joined to
        this cluster; its result (a dict)."""
        spec = {"address": self.address, **spec}
        done = subprocess.run([sys.executable, "-m", "tests.backends.cluster_driver",
                               json.dumps(spec)], capture_output=True, text=True,
                              env=self.env, cwd=ROOT, timeout=timeout)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"the driver failed (exit {done.returncode}):\n"
                               f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}")
        return json.loads(lines[-1][len("RESULT "):])

    def _ip(self, *arguments: str) -> None:
        done = subprocess.run(["ip", *arguments], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(arguments)}: {done.stderr.strip()}")
