"""Stops and the process backend: Ctrl-C reaches every process of the terminal's group,
and the serving process decides; a client neither dies of it nor prints a traceback."""

import os
import signal

import pytest

import async_search as asr
from tests.backends import searches

pytestmark = pytest.mark.timeout(180)


async def ctrl_c_then_echo_sum(start, evaluate):
    """echo_sum, after a Ctrl-C has reached this (client) process."""
    if start == 0:
        os.kill(os.getpid(), signal.SIGINT)
    return await searches.echo_sum(start, evaluate)


def test_a_ctrl_c_that_reaches_a_client_process_does_not_end_its_searches(capfd):
    out = asr.run_searches(ctrl_c_then_echo_sum, list(range(4)), searches.small_mlp,
                           backend="process", num_procs=2)
    assert out == searches.baseline(searches.echo_sum, list(range(4)),
                                    searches.small_mlp())
    assert "Traceback" not in capfd.readouterr().err
