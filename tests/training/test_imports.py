"""The core and the training package import without TensorFlow; training needs it only
when a Trainer is made."""

import subprocess
import sys

BLOCK_TF = ("import sys; sys.modules['tensorflow'] = None; "  # import tensorflow fails
            "import async_search, async_search.problems, async_search.training; ")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_the_core_and_the_shipped_models_work_without_tensorflow():
    run = python(BLOCK_TF + "from async_search import problems; "
                 "net = problems.pretrained('connect_four'); g = problems.ConnectFour(); "
                 "print(net(g.encode([g.initial_state()]))[0].shape)")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "(1, 7)" in run.stdout


def test_making_a_trainer_without_tensorflow_says_what_is_missing():
    run = python(BLOCK_TF + "from async_search.training import Trainer, NetConfig; "
                 "Trainer(NetConfig('policy_value', 'connect_four', (8,)))")
    assert run.returncode != 0
    assert "training a net needs tensorflow, which is not installed: pip install" \
        " 'async_search[tf]'" in run.stderr
