"""The codec workers' environment: they import this package from where it was found."""

import site

from async_search.http.codec_pool import worker_environment


def test_a_source_tree_goes_first_on_the_workers_pythonpath(tmp_path):
    env = worker_environment(str(tmp_path), {"PYTHONPATH": "/elsewhere", "A": "1"})
    assert env == {"PYTHONPATH": f"{tmp_path}:/elsewhere", "A": "1"}
    assert worker_environment(str(tmp_path), {})["PYTHONPATH"] == str(tmp_path)


def test_an_installed_package_leaves_the_pythonpath_as_it_is():
    """site-packages on PYTHONPATH comes before the standard library: a module there
    named as one of the library's would shadow it in the worker."""
    for folder in site.getsitepackages():
        assert worker_environment(folder, {"A": "1"}) == {"A": "1"}
        assert worker_environment(folder + "/", {"PYTHONPATH": "/x"}) == {
            "PYTHONPATH": "/x"}
