"""KServe's own model server (the ``kserve`` package) as a peer that no one here wrote:
a child process serving ``x @ W`` as "linear" over HTTP and, when asked, gRPC.

kserve pins protobuf<7, psutil<6 and pandas<3, so it runs in a python of its own:
``$ASYNC_SEARCH_KSERVE_PYTHON`` (.ci/run makes ``.venv-kserve`` with ``pip install
kserve``), else this python when it has kserve; tests that need it are skipped only
when there is neither. Where ``$ASYNC_SEARCH_KSERVE_READY`` names a file, kserve is still
being installed (in the background, by .ci/run) until that file holds the install's exit
status: the peer waits for it.
"""

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

__all__ = ["W", "kserve_model_server", "kserve_python", "needs_kserve", "wait_for_install"]

KSERVE_SERVER = textwrap.dedent('''
    import sys
    import numpy as np
    from kserve import InferOutput, InferResponse, Model, ModelServer
    from kserve.utils.utils import generate_uuid

    W = np.arange(64, dtype=np.float32).reshape(16, 4) / 64

    class Linear(Model):
        def __init__(self, name):
            super().__init__(name)
            self.ready = True

        def get_input_types(self):
            return [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]

        def get_output_types(self):
            return [{"name": "output", "datatype": "FP32", "shape": [-1, 4]}]

        async def predict(self, payload, headers=None, response_headers=None):
            y = payload.inputs[0].as_numpy() @ W
            out = InferOutput(name="output", shape=list(y.shape), datatype="FP32")
            out.set_data_from_numpy(y, binary_data=True)
            return InferResponse(model_name=self.name, infer_outputs=[out],
                                 response_id=payload.id or generate_uuid())

    grpc_port = int(sys.argv[2])
    ModelServer(http_port=int(sys.argv[1]), grpc_port=grpc_port or 8081,
                enable_grpc=bool(grpc_port), workers=1).start([Linear("linear")])
''')
W = np.arange(64, dtype=np.float32).reshape(16, 4) / 64


def kserve_python() -> str | None:
    """A python that has kserve: $ASYNC_SEARCH_KSERVE_PYTHON (kserve pins protobuf<7,
    psutil<6 and pandas<3, so CI installs it in a venv of its own), else this one when
    it has kserve."""
    named = os.environ.get("ASYNC_SEARCH_KSERVE_PYTHON")
    if named:
        return named  # a wrong path fails the test: CI meant it to run
    return sys.executable if importlib.util.find_spec("kserve") is not None else None


needs_kserve = pytest.mark.skipif(
    kserve_python() is None,
    reason="no python with kserve: set ASYNC_SEARCH_KSERVE_PYTHON to one (.ci/run makes "
           ".venv-kserve with 'pip install kserve'), or install kserve here")


#: How long the peer waits for kserve's background install (.ci/run) to finish.
INSTALL_WAIT_S = 100.0


def wait_for_install(marker: str | None = None, timeout: float = INSTALL_WAIT_S) -> None:
    """Returns once kserve's background install has succeeded: at once when no
    install is announced (``$ASYNC_SEARCH_KSERVE_READY`` unset); fails the test, with
    the install's log, when it failed or did not end within ``timeout``."""
    marker = marker or os.environ.get("ASYNC_SEARCH_KSERVE_READY")
    if not marker:
        return
    deadline = time.monotonic() + timeout
    while not os.path.exists(marker):
        if time.monotonic() > deadline:
            pytest.fail(f"kserve's install did not finish within {timeout:.0f} s "
                        f"(no {marker})")
        time.sleep(0.5)
    with open(marker) as f:
        status = f.read().strip()
    if status != "0":
        log = os.path.join(os.path.dirname(marker), "install.log")
        text = open(log, errors="replace").read()[-3000:] if os.path.exists(log) else ""
        pytest.fail(f"kserve's install failed (exit status {status}):\n{text}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lost_a_port(server: subprocess.Popen, log, timeout: float = 60.0) -> bool:
    """Whether KServe stopped because another process bound one of its ports first
    (uvicorn then logs the error and exits): waits until it says it is listening, or
    stops, or ``timeout`` passes (the test's own wait then fails with the log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "Uvicorn running on" in text:
            return False
        lost = "address already in use" in text.lower() or "failed to bind" in text.lower()
        if lost or server.poll() is not None:
            if server.poll() is None:
                server.kill()
            server.wait(10)
            return lost
        time.sleep(0.1)
    return False


@contextlib.contextmanager
def kserve_model_server(tmp_path, grpc: bool = False):
    """KServe's ModelServer serving ``x @ W`` as "linear", in a child process of its own
    python; yields its HTTP and gRPC ports (gRPC 0: off). Its log is in the failure."""
    wait_for_install()
    script = tmp_path / "kserve_linear.py"
    script.write_text(KSERVE_SERVER)
    log = tmp_path / "kserve.log"
    for _ in range(3):  # a port from free_port() may be taken before KServe binds it
        ports = free_port(), free_port() if grpc else 0
        with open(log, "wb") as out:
            server = subprocess.Popen([kserve_python(), str(script), *map(str, ports)],
                                      stdout=out, stderr=subprocess.STDOUT,
                                      env={**os.environ})
        if not _lost_a_port(server, log):
            break
    try:
        yield ports
    except BaseException as e:
        e.add_note(f"KServe's log:\n{log.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
