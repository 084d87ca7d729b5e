"""The process backend as scripts, notebooks, ``python -c`` and stdin call it: its
clients are spawned, and a spawned process imports the main script again, so a script
without the ``__main__`` guard, or searches defined where a client cannot import them,
must fail at once with an error that says what to do, never after retries."""

import os
import subprocess
import sys
import textwrap

import pytest

import async_search as asr
from tests.backends import searches

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: A search and a model factory that print, so that the output says who ran them.
HEADER = textwrap.dedent("""
    import async_search as asr
    from async_search import problems, search
    puzzle = problems.SlidingPuzzle(3)
    def model_factory():
        print("FACTORY RAN", flush=True)
        return problems.ManhattanHeuristic(puzzle)
    async def astar(start, evaluate):
        return await search.batched_astar(puzzle, start, evaluate, budget=200,
                                          buffer_size=4)
    starts = [puzzle.scramble(8, seed=s) for s in range(4)]
    """)
RUN = ("out = asr.run_searches(astar, starts, model_factory, backend='process', "
       "num_procs=2)\nprint('RESULTS', [r.status.value for r in out])\n")


def run_python(args, stdin=None, cwd=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def test_a_script_without_the_main_guard_fails_once_per_client_and_names_the_guard(
        tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(HEADER + RUN)
    done = run_python([str(script)])
    assert done.returncode != 0
    # Each client process says why (the guard) before it calls model_factory; the run
    # says it too, and does not start new clients for an error every one would meet.
    assert done.stderr.count('under `if __name__ == "__main__":`') >= 2
    assert "before it began" in done.stderr and "attempts" not in done.stderr
    assert done.stdout.count("FACTORY RAN") == 1  # the parent's only
    assert done.stderr.count("RuntimeError: run_searches was called while a spawned") == 2


def test_a_script_read_from_stdin_runs_on_the_process_backend(tmp_path):
    # Its searches come from a module: spawn used to run "<stdin>" again as a path.
    source = textwrap.dedent("""
        import async_search as asr
        from tests.backends import searches
        if __name__ == "__main__":
            out = asr.run_searches(searches.echo_sum, [5] * 4, searches.small_mlp,
                                   backend="process", num_procs=2)
            print("RESULTS", len(out))
        """)
    done = run_python(["-"], stdin=source, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RESULTS 4" in done.stdout


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_search_defined_in_an_interactive_main_is_refused_before_any_client(
        how, tmp_path):
    source = HEADER + RUN
    done = (run_python(["-c", source], cwd=tmp_path) if how == "-c" else
            run_python(["-"], stdin=source, cwd=tmp_path))
    assert done.returncode != 0
    assert ("TypeError: search_fn refers to 'astar', defined in a __main__ that the "
            "process backend's client processes cannot import") in done.stderr
    assert "define it in a .py module" in done.stderr
    assert "(pid " not in done.stderr  # no client process started


def test_a_search_defined_in_a_script_that_is_a_file_still_runs(tmp_path):
    script = tmp_path / "guarded.py"
    script.write_text(HEADER + "if __name__ == '__main__':\n" + textwrap.indent(RUN, "    "))
    done = run_python([str(script)])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RESULTS ['goal_found'" in done.stdout


async def _agen(start, evaluate):
    yield start


def _not_async(start, evaluate):
    return start


def test_an_async_generator_search_is_refused_before_anything_starts():
    for backend in ("local", "process"):
        with pytest.raises(TypeError, match="async def that returns its result"):
            asr.run_searches(_agen, [1], searches.small_mlp, backend=backend)


def test_a_search_that_returns_no_awaitable_fails_saying_it_must_be_an_async_def():
    with pytest.raises(asr.SearchError) as info:
        asr.run_searches(_not_async, [1, 2], searches.small_mlp, backend="process",
                         num_procs=1)
    error = info.value.failures[0]
    assert isinstance(error, TypeError)
    assert "returned int, not an awaitable: search_fn must be an async def" in str(error)


def test_an_unpicklable_start_gets_no_hint_meant_for_functions():
    import threading
    with pytest.raises(TypeError) as info:
        asr.run_searches(searches.echo_sum, [1, threading.Lock()], searches.small_mlp,
                         backend="process")
    assert "start 1" in str(info.value) and "module-level function" not in str(info.value)


def _slow_factory():
    import time
    time.sleep(1.5)
    return searches.small_mlp()


def test_a_timeout_spent_in_model_factory_says_no_attempt_began():
    with pytest.raises(asr.SearchError) as info:
        asr.run_searches(searches.echo_sum, [1, 2], _slow_factory, backend="process",
                         timeout=0.5)
    error = info.value.failures[0]
    assert isinstance(error, asr.SearchTimeoutError)
    assert "no attempt began" in str(error) and "model_factory" in str(error)
    assert "lost attempts: )" not in str(error)


def test_a_search_defined_in_a_packages_main_is_refused_before_any_client(tmp_path):
    # python -m pkg runs pkg/__main__.py, which spawn never imports again.
    package = tmp_path / "searchpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(HEADER + RUN)
    done = run_python(["-m", "searchpkg"], cwd=tmp_path)
    assert done.returncode != 0
    assert "TypeError: search_fn refers to 'astar'" in done.stderr
    assert "(pid " not in done.stderr


def test_threads_spawning_clients_of_a_stdin_script_never_see_its_name(tmp_path):
    # One thread's restore of __main__.__file__ must not land in another's start.
    source = textwrap.dedent("""
        import multiprocessing.spawn, threading, time
        import async_search as asr
        from tests.backends import searches
        prepare = multiprocessing.spawn.get_preparation_data
        def slow_prepare(name):  # each thread's start reads the name at its own time
            time.sleep(0.05 + 0.25 * int(threading.current_thread().name[-1]))
            return prepare(name)
        multiprocessing.spawn.get_preparation_data = slow_prepare
        def run(out):
            out.append(len(asr.run_searches(searches.echo_sum, [5] * 4,
                                            searches.small_mlp, backend="process",
                                            num_procs=4)))
        if __name__ == "__main__":
            out = []
            threads = [threading.Thread(target=run, args=(out,), name=f"t{i}")
                       for i in range(3)]
            for t in threads: t.start()
            for t in threads: t.join()
            print("RESULTS", sorted(out))
        """)
    done = run_python(["-"], stdin=source, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RESULTS [4, 4, 4]" in done.stdout
