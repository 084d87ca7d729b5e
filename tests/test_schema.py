"""read_json: the JSON files this project writes, read as strictly as they are written."""

import pytest

from async_search.errors import CheckpointError
from async_search.schema import read_json


def test_read_json_reads_what_the_project_writes(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"a": 1, "b": [1.5, null, {"c": "d"}], "e": {"a": 2}}')
    assert read_json(path) == {"a": 1, "b": [1.5, None, {"c": "d"}], "e": {"a": 2}}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_read_json_refuses_a_number_that_strict_json_has_not(tmp_path, constant):
    """Every writer here uses allow_nan=False: a NaN was put there by hand or by
    another program, and a checkpoint that loads with it could not be saved again."""
    path = tmp_path / "config.json"
    path.write_text('{"metadata": {"loss": [1.0, %s]}}' % constant)
    with pytest.raises(CheckpointError, match=f"never writes .*: {constant} is not a JSON "
                                              f"number") as refused:
        read_json(path)
    assert "truncated" not in str(refused.value)  # the file is whole


@pytest.mark.parametrize("number", ["1e400", "-1e400"])
def test_read_json_refuses_a_number_past_the_floats(tmp_path, number):
    """JSON reads 1e400 as inf, without a word: a checkpoint holding it loaded, and
    could not be saved again."""
    path = tmp_path / "config.json"
    path.write_text('{"metadata": {"loss": %s, "ok": 1.5e300}}' % number)
    with pytest.raises(CheckpointError, match=f"never writes .*: {number} is past"):
        read_json(path)


@pytest.mark.parametrize("text", ['{"metadata": 1, "format": 2, "metadata": 3}',
                                  '[{"x": {"a": 1, "a": 1}}]'])
def test_read_json_refuses_a_key_written_twice_in_one_object(tmp_path, text):
    """A plain reader keeps one of the two values without a word."""
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(CheckpointError, match="key '(metadata|a)' is written twice"):
        read_json(path)
