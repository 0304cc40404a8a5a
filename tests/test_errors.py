"""Bad input gets an error naming the argument, dimension, axis and sizes."""

from __future__ import annotations

import numpy as np
import pytest

import partir_plugin as partir


def f(x, w1, w2):
    return (x @ w1) @ w2


ARGS = (np.ones((256, 8), np.float32), np.ones((8, 16), np.float32),
        np.ones((16, 8), np.float32))


def _lower(schedule, mesh=None, args=ARGS, **options):
    step, _ = partir.jit(f, mesh or {"B": 4, "M": 2}, schedule, **options)
    return step.lower(*args)


def test_not_divisible_with_padding_off_names_argument_dimension_axis_and_sizes():
    args = (np.ones((250, 8), np.float32), *ARGS[1:])
    with pytest.raises(partir.PartitionError) as e:
        _lower([partir.ManualPartition({"x": 0}, axis="B")], args=args, padding="error")
    msg = str(e.value)
    assert "'x'" in msg and "dimension 0" in msg and "'B'" in msg
    assert "250" in msg and "size 4" in msg and "padding" in msg


def test_unknown_argument_name():
    with pytest.raises(partir.PartitionError, match=r"unknown argument name 'y'.*\['x', 'w1', "
                                                    r"'w2'\]"):
        _lower([partir.ManualPartition({"y": 0}, axis="B")])


def test_axis_not_in_mesh():
    with pytest.raises(partir.PartitionError, match=r"axis 'Q' is not in the mesh .*'B': 4"):
        _lower([partir.ManualPartition({"x": 0}, axis="Q")])


def test_mesh_larger_than_devices():
    with pytest.raises(partir.PartitionError, match=r"needs 16 devices but only 8"):
        partir.jit(f, {"a": 16}, [])


def test_dimension_out_of_range_and_bad_selector():
    with pytest.raises(partir.PartitionError, match=r"'w1' of shape \(8, 16\) on dimension 2"):
        _lower([partir.ManualPartition({"w1": 2}, axis="M")])
    with pytest.raises(partir.PartitionError, match="must be an int dimension"):
        _lower([partir.ManualPartition({"w1": "rows"}, axis="M")])


def test_nested_dict_selector_unknown_key():
    def g(params, x):
        return x @ params["dense"]["kernel"]

    params = {"dense": {"kernel": np.ones((8, 4), np.float32)}}
    step, _ = partir.jit(g, {"M": 2}, [partir.ManualPartition({"params": {"dens": {
        "kernel": 1}}}, axis="M")])
    with pytest.raises(partir.PartitionError, match=r"'params' has no key 'dens'.*'dense'"):
        step.lower(params, np.ones((4, 8), np.float32))


def test_same_axis_twice_on_one_value():
    with pytest.raises(partir.PartitionError, match="already tiled on axis 'B'"):
        _lower([partir.ManualPartition({"w1": 0}, axis="B"),
                partir.ManualPartition({"w1": 1}, axis="B")])
