"""The public API's type hints accept the contract's calls as researchers write them:
mypy checks ``tests/typed_callers.py`` against the package's hints (``py.typed``)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(300)
def test_the_contract_s_calls_type_check(tmp_path):
    env = dict(os.environ, MYPYPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--cache-dir",
         str(tmp_path / "cache"), "--no-incremental", "--disallow-untyped-calls",
         os.path.join(ROOT, "tests", "typed_callers.py")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=280)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
