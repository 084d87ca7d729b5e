"""The optional extras: a name that needs one, without it, says which to install."""

import subprocess
import sys

import numpy as np
import pytest

from async_search.base import TensorSpec
from async_search.extras import EXTRA_OF, extra_error, import_extra

SPEC = TensorSpec((3,), np.float32)


def blocked(*modules):
    """Python code that makes ``modules`` impossible to import (as if not installed)."""
    return "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)


def run(code, timeout=120):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


def test_extra_error_names_the_extra_of_a_missing_framework():
    for module, extra in EXTRA_OF.items():
        error = extra_error(ModuleNotFoundError(f"No module named {module!r}",
                                                name=module), "thing")
        assert isinstance(error, ModuleNotFoundError) and error.name == module
        assert f"thing needs {module}, which is not installed" in str(error)
        assert f"pip install 'async_search[{extra}]'" in str(error)
        assert f"pip install -e '.[{extra}]'" in str(error)


def test_extra_error_leaves_other_missing_modules_as_they_are():
    own = ModuleNotFoundError("No module named 'mypackage'", name="mypackage")
    assert extra_error(own, "thing") is own
    # A module of an installed framework missing: the framework is broken, not absent.
    broken = ModuleNotFoundError("No module named 'torch._C'", name="torch._C")
    assert extra_error(broken, "thing") is broken
    nameless = ModuleNotFoundError("something")
    assert extra_error(nameless, "thing") is nameless


def test_import_extra_imports_and_names_the_extra_when_missing(monkeypatch):
    assert import_extra("numpy", "the core") is np
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ModuleNotFoundError, match=r"TorchModel needs torch, which is not "
                                                  r"installed: pip install 'async_search"
                                                  r"\[torch\]'"):
        import_extra("torch", "TorchModel")


def test_a_broken_framework_is_not_called_missing(tmp_path, monkeypatch):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("import torch._gone_from_this_build\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with pytest.raises(ModuleNotFoundError,
                       match="No module named 'torch._gone_from_this_build'") as raised:
        import_extra("torch", "TorchModel")
    assert "not installed" not in str(raised.value)


@pytest.mark.parametrize("module, call, message", [
    ("torch", "from async_search.models import TorchModel\n"
              "TorchModel(None, input_spec=SPEC)", "TorchModel needs torch"),
    ("jax", "from async_search.models import JaxModel\n"
            "JaxModel(lambda p, x: x, {}, input_spec=SPEC)", "JaxModel needs jax"),
    ("tensorflow", "from async_search.models import TensorFlowModel\n"
                   "TensorFlowModel(lambda x: x, input_spec=SPEC)",
     "TensorFlowModel needs tensorflow"),
    ("tensorflow", "from async_search import problems\n"
                   "problems.tf_twin(problems.pretrained('connect_four'))",
     "tf_twin needs tensorflow"),
    ("torch", "from async_search import problems\n"
              "problems.torch_resnet(problems.CostToGoResNet(problems.SlidingPuzzle(3), "
              "first_width=4, width=4, blocks=1))", "torch_resnet needs torch"),
    ("ray", "from async_search.ray_init import ensure_ray\nensure_ray()",
     "the Ray backend needs ray"),
    ("aiohttp", "from async_search.http import HttpFront",
     "async_search.http.HttpFront needs aiohttp"),
    ("grpc", "from async_search.http import GrpcFront",
     "async_search.http.GrpcFront needs grpc"),
    ("aiohttp", "import asyncio\nfrom async_search.http.client import RemoteEvaluate\n"
                "async def main():\n"
                "    async with RemoteEvaluate('http://127.0.0.1:9', 'm'):\n"
                "        pass\n"
                "asyncio.run(main())", "RemoteEvaluate needs aiohttp"),
    ("seaborn", "from async_search.experiments import plot_runs\nplot_runs([])",
     "plot_runs needs seaborn"),
    ("matplotlib", "from async_search.experiments.training import plot_training\n"
                   "plot_training([], None)", "plot_training needs matplotlib"),
    ("pandas", "from async_search.experiments.heuristic_training import "
               "plot_heuristic_training\nplot_heuristic_training([], {}, None)",
     "plot_heuristic_training needs pandas"),
    ("tqdm", "from async_search.experiments.progress import progress_bar\n"
             "with progress_bar('x', 3):\n    pass", "a progress bar (show_progress=False "
                                                   "for none) needs tqdm"),
])
def test_a_name_that_needs_a_missing_extra_says_which_to_install(module, call, message):
    done = run(blocked(module) + "import numpy as np\nfrom async_search.base import "
               "TensorSpec\nSPEC = TensorSpec((3,), np.float32)\n" + call)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: " + message), done.stderr[-1500:]
    assert f"pip install 'async_search[{EXTRA_OF[module]}]'" in last


@pytest.mark.parametrize("module, flags, message", [
    ("aiohttp", ["--help"], "python -m async_search.http needs aiohttp"),
    ("grpc", ["--port", "0", "--grpc-port", "0"],
     "python -m async_search.http: --grpc-port needs grpc"),
])
def test_python_m_async_search_http_without_its_extra_exits_in_one_line(module, flags,
                                                                          message):
    if module != "aiohttp":
        pytest.importorskip("aiohttp")  # the HTTP front comes first: its extra is there
    code = (blocked(module) + "import runpy\nsys.argv = ['async_search.http'] + "
            f"{flags!r}\nrunpy.run_module('async_search.http', run_name='__main__')")
    done = run(code)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    assert "serving" not in done.stderr  # refused before the HTTP front served
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(message), last  # (the command named once)
    assert f"'async_search[{EXTRA_OF[module]}]'" in last


def test_a_broken_http_extra_is_reported_as_it_is(tmp_path):
    """A module of an installed aiohttp missing is no missing extra: its own error,
    with its traceback (and not as its own cause)."""
    fake = tmp_path / "aiohttp"
    fake.mkdir()
    (fake / "__init__.py").write_text("import aiohttp._gone_from_this_build\n")
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
            "try:\n"
            "    from async_search.http import HttpFront\n"
            "except ModuleNotFoundError as e:\n"
            "    print(e.name, e.__cause__ is e)\n")
    done = run(code)
    assert done.stdout.split() == ["aiohttp._gone_from_this_build", "False"], done.stderr
    main = run(f"import sys; sys.path.insert(0, {str(tmp_path)!r})\nimport runpy\n"
               "sys.argv = ['async_search.http', '--help']\n"
               "runpy.run_module('async_search.http', run_name='__main__')")
    assert "Traceback" in main.stderr and "not installed" not in main.stderr
    assert "No module named 'aiohttp._gone_from_this_build'" in main.stderr
