import numpy as np
import pytest

from async_search.servers.policy import DispatchPolicy, Reason


def test_defaults():
    policy = DispatchPolicy()
    assert (policy.max_batch_size, policy.max_delay, policy.pipeline_depth) == (256, None, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_batch_size": True}, "max_batch_size must be an integer >= 1, 'auto' or an "
     "AutoBatchSize, got True"),
    ({"max_batch_size": False}, "max_batch_size must be an integer >= 1, 'auto' or an "
     "AutoBatchSize, got False"),
    ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, 'auto' or an "
     "AutoBatchSize, got 0"),
    ({"max_batch_size": 8.0}, "max_batch_size must be an integer >= 1, 'auto' or an "
     "AutoBatchSize, got 8.0"),
    ({"pipeline_depth": True}, "pipeline_depth must be an integer >= 1, got True"),
    ({"pipeline_depth": 0}, "pipeline_depth must be an integer >= 1, got 0"),
    ({"max_delay": -0.001}, "max_delay must be a finite number >= 0, got -0.001"),
    ({"max_delay": True}, "max_delay must be a finite number >= 0, got True"),
    ({"max_delay": float("nan")}, "max_delay must be a finite number >= 0, got nan"),
])
def test_bad_policy_names_the_field_and_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DispatchPolicy(**kwargs)


def test_numpy_numbers_are_stored_as_python_numbers():
    policy = DispatchPolicy(np.int64(64), np.float32(0.5), np.int32(3))
    assert policy == DispatchPolicy(64, 0.5, 3)
    assert type(policy.max_batch_size) is int and type(policy.pipeline_depth) is int
    assert type(policy.max_delay) is float


def test_reasons_are_strings():
    assert Reason.FULL == "full" and Reason("idle") is Reason.IDLE
