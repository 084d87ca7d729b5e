import os

import pytest

from async_search.experiments.outputs import check_output_file, check_output_folder


def test_a_missing_folder_is_made_written_and_removed_again(tmp_path):
    check_output_file(str(tmp_path / "a" / "b" / "r.png"), "--save_path")
    check_output_folder(str(tmp_path / "c" / "d"), "--save_dir")
    assert list(tmp_path.iterdir()) == []  # no folder, no probe left


def test_an_existing_folder_and_file_pass_and_stay_as_they_were(tmp_path):
    (tmp_path / "r.png").write_bytes(b"old plot")
    check_output_file(str(tmp_path / "r.png"), "--save_path")
    check_output_folder(str(tmp_path), "--save_dir")
    assert [p.name for p in tmp_path.iterdir()] == ["r.png"]
    assert (tmp_path / "r.png").read_bytes() == b"old plot"


@pytest.mark.parametrize("under", ["run.json/x", "run.json/x/y", "run.json"])
def test_a_path_under_a_file_names_the_file(tmp_path, under):
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(ValueError) as e:
        check_output_folder(str(tmp_path / under), "--save_dir")
    assert str(e.value) == (f"--save_dir={tmp_path / under} cannot be written: "
                            f"{tmp_path / 'run.json'} is a file, not a folder")
    with pytest.raises(ValueError, match="run.json is a file, not a folder"):
        check_output_file(str(tmp_path / under / "r.png"), "--save_path")
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_relative_path_is_named_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text("{}")
    with pytest.raises(ValueError) as e:
        check_output_folder("results/run.json/x", "--save_dir")
    assert str(e.value) == ("--save_dir=results/run.json/x cannot be written: "
                            "results/run.json is a file, not a folder")


def test_a_folder_where_the_file_goes_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a folder, not a file"):
        check_output_file(str(tmp_path), "--save_path")
    with pytest.raises(ValueError, match="names a folder; it must name a file"):
        check_output_file(str(tmp_path) + os.sep, "--save_path")


def test_a_device_or_a_pipe_where_the_file_goes_is_refused(tmp_path):
    # The plot's temporary was renamed over it: /dev/null became a regular file.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), os.devnull):
        with pytest.raises(ValueError, match="is not a regular file"):
            check_output_file(path, "--save_path")
    assert os.path.exists(os.devnull) and not os.path.isfile(os.devnull)


def test_a_file_name_past_the_file_systems_limit_is_refused_before_any_work(tmp_path):
    # The probe's short name passed; the run failed writing its plot, at the end.
    with pytest.raises(ValueError, match="longer than the 255 bytes"):
        check_output_file(str(tmp_path / "out" / ("a" * 252 + ".png")), "--save_path")
    check_output_file(str(tmp_path / "out" / ("a" * 251 + ".png")), "--save_path")


def test_a_derived_path_is_shown_with_the_flag_value(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"^--save_path=f/r\.png cannot be written: "):
        check_output_file(str(tmp_path / "f" / "r.json"), "--save_path", value="f/r.png")


def test_a_dangling_link_is_in_the_way(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    with pytest.raises(ValueError, match="link is not a folder"):
        check_output_folder(str(tmp_path / "link" / "x"), "--save_dir")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_folder_that_cannot_be_made_or_written_says_why():
    with pytest.raises(ValueError, match=r"cannot make the folder /proc/async_search"):
        check_output_folder("/proc/async_search/x", "--save_dir")
    with pytest.raises(ValueError, match=r"cannot write in /proc \("):
        check_output_file("/proc/r.png", "--save_path")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_folder_says_no_permission(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="no permission"):
            check_output_file(str(folder / "r.png"), "--save_path")
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize("name", [" ", "   ", "\t", " .png", "  .json", " .tar.gz"])
def test_a_file_named_by_blanks_is_refused(tmp_path, name):
    """main.py --save_path " " wrote a plot named " " and a JSON " .json" (and
    --architecture checked only the JSON, " .json")."""
    with pytest.raises(ValueError, match="names a file of blanks"):
        check_output_file(os.path.join(str(tmp_path), name), "--save_path")
    with pytest.raises(ValueError, match="names a file of blanks"):
        check_output_file(name, "--save_path")
    assert os.listdir(tmp_path) == []
