"""Bad models, options and inputs raise clear exceptions (never a crash)."""

import numpy as np
import pytest

import tilec
from conftest import MODELS

GPT2 = MODELS / "gpt2" / "model.onnx"
BERT = MODELS / "bert" / "model.onnx"


@pytest.fixture(scope="module")
def bert():
    return tilec.compile(BERT)


def ids(*shape):
    return np.zeros(shape, np.int64)


def test_unknown_input_name(bert):
    with pytest.raises(tilec.InvalidInputError, match=r"no input 'input_idz' \(its inputs: input_ids, attention_mask\)"):
        bert.run({"input_idz": ids(1, 4), "attention_mask": ids(1, 4)})


def test_missing_input(bert):
    with pytest.raises(tilec.InvalidInputError, match=r"input 'attention_mask' is missing"):
        bert.run({"input_ids": ids(1, 4)})


def test_wrong_count(bert):
    with pytest.raises(tilec.InvalidInputError, match=r"the model has 2 inputs \(input_ids, attention_mask\), 1 were given"):
        bert.run([ids(1, 4)])


def test_wrong_dtype(bert):
    with pytest.raises(tilec.InvalidInputError, match=r"input 'input_ids'.*wrong dtype \(expected i64, got f32\)"):
        bert.run([np.zeros((1, 4), np.float32), ids(1, 4)])


def test_wrong_rank(bert):
    with pytest.raises(tilec.InvalidInputError, match=r"wrong rank \(expected 2, got 1\)"):
        bert.run([ids(4), ids(1, 4)])


def test_inconsistent_symbolic_dimension(bert):
    with pytest.raises(tilec.InvalidInputError, match=r"dimension 1 \('seq'\) is 4 from another input, here 5"):
        bert.run([ids(1, 4), ids(1, 5)])


def test_unsupported_dtype(bert):
    with pytest.raises(tilec.InvalidInputError, match=r"input 'input_ids'.*complex|not a tensor|not supported"):
        bert.run([np.zeros((1, 4), np.complex64), ids(1, 4)])


def test_not_a_tensor(bert):
    with pytest.raises(tilec.InvalidInputError):
        bert.run([object(), ids(1, 4)])


def test_errors_are_exceptions_and_the_model_still_runs(bert):
    assert issubclass(tilec.InvalidInputError, tilec.TilecError)
    assert issubclass(tilec.TilecError, Exception)
    with pytest.raises(tilec.TilecError):
        bert.run([ids(1, 4)])
    (y,) = bert.run([ids(1, 4), np.ones((1, 4), np.int64)])
    assert y.shape == (1, 4, 256)


def test_bad_model_bytes():
    with pytest.raises(tilec.TilecError, match="not an ONNX model"):
        tilec.compile(b"\x08\x07garbage\xff\xff")


def test_missing_file(tmp_path):
    with pytest.raises(tilec.TilecError, match="nothing.onnx"):
        tilec.compile(tmp_path / "nothing.onnx")


def test_bad_model_argument():
    with pytest.raises(tilec.InvalidInputError, match="expected a path, ONNX bytes or an onnx.ModelProto"):
        tilec.compile(42)


def test_bad_options():
    with pytest.raises(tilec.InvalidInputError, match=r"target 'tpu'"):
        tilec.compile(GPT2, target="tpu")
    with pytest.raises(tilec.InvalidInputError, match=r"dtype 'int3'"):
        tilec.compile(GPT2, dtype="int3")
    with pytest.raises(tilec.InvalidInputError, match=r"unknown option 'fast'"):
        tilec.compile(GPT2, fast=True)
    with pytest.raises(tilec.InvalidInputError, match=r"opt_level 7"):
        tilec.compile(GPT2, opt_level=7)


def test_cuda_without_a_gpu_is_an_error_not_a_crash():
    m = tilec.compile(GPT2, target="cuda")  # the device is opened by the first run
    try:
        m.run([ids(1, 4)])
    except tilec.TilecError as e:
        assert "CUDA" in str(e) and not isinstance(e, tilec.InvalidInputError)
    else:
        pytest.skip("a GPU is present: this test is about machines without one")


def test_unsupported_op_names_it():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("RandomUniformLike", ["x"], ["y"])],
        "rand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(tilec.TilecError, match="RandomUniformLike"):
        tilec.compile(m)
