"""tests/kserve_peer.py: waiting for kserve's background install (.ci/run)."""

import pytest

from tests.kserve_peer import wait_for_install


def test_without_an_announced_install_nothing_is_waited_for(monkeypatch):
    monkeypatch.delenv("ASYNC_SEARCH_KSERVE_READY", raising=False)
    wait_for_install(timeout=0.0)


def test_a_finished_install_lets_the_peer_start(tmp_path):
    marker = tmp_path / "install-status"
    marker.write_text("0\n")
    wait_for_install(str(marker), timeout=0.0)


def test_a_failed_install_fails_the_test_with_its_log(tmp_path):
    marker = tmp_path / "install-status"
    marker.write_text("1\n")
    (tmp_path / "install.log").write_text("ERROR: No matching distribution for kserve")
    with pytest.raises(pytest.fail.Exception, match="(?s)exit status 1.*No matching"):
        wait_for_install(str(marker), timeout=0.0)


def test_an_install_that_does_not_end_in_time_fails_the_test(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="did not finish within"):
        wait_for_install(str(tmp_path / "install-status"), timeout=0.2)
