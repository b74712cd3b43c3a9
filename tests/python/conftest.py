"""Shared helpers of the Python package's tests: the repository's models and their recorded
inputs and outputs."""

import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
LIGHT = ROOT / "testdata" / "gen" / "light"


def read_pb(path):
    """A TensorProto file as a NumPy array."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    t = onnx.TensorProto()
    t.ParseFromString(pathlib.Path(path).read_bytes())
    return numpy_helper.to_array(t)


def recorded(model_dir):
    """The inputs and expected outputs of `model_dir/test_data_set_0`, in order."""
    d = pathlib.Path(model_dir) / "test_data_set_0"
    ins = [read_pb(p) for p in sorted(d.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
    outs = [read_pb(p) for p in sorted(d.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
    return ins, outs


def assert_close(got, want, rtol=1e-3, atol=1e-4):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
