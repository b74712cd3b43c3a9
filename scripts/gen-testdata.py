#!/usr/bin/env python3
"""Generate ONNX conformance test data for tilec from the installed `onnx` package.

Layout written under --out (default: <repo>/testdata/gen):

  node/<test_name>/model.onnx
  node/<test_name>/meta.json                     {"rtol": ..., "atol": ...}
  node/<test_name>/test_data_set_<k>/input_<i>.pb, output_<i>.pb
  light/<name>/model.onnx
  light/<name>/meta.json
  light/<name>/test_data_set_0/input_<i>.pb, output_<i>.pb

Node cases come from `onnx.backend.test.case.node.collect_testcases(None)` and
are serialized the way `onnx/backend/test/cmd_tools.py generate-data` does: a
value whose graph input/output is sequence-, optional- or map-typed is written
as a SequenceProto / OptionalProto / MapProto; a tensor value given as a
TensorProto is written as is; a numpy array goes through
`numpy_helper.from_array(value, <graph input/output name>)`.

Light models are onnx's `backend/test/data/light/light_<name>.onnx`, with
inputs generated as onnx's runner does for them (`generate_dummy_data(...,
random=False)`) and expected outputs copied from `light_<name>_output_<i>.pb`.

The legacy global numpy RNG is seeded before the node cases are built (many
cases call `np.random.*` unseeded at import time), so the output is
deterministic. Each run rebuilds node/ and light/ from scratch, so it is
idempotent. Uses only onnx and numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import onnx
from onnx import TensorProto, numpy_helper

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "testdata" / "gen"

# Tolerances onnx's runner uses when a test case does not specify any
# (`onnx/backend/test/loader`, `TestCase` defaults for node cases).
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7

ONNX_DIR = Path(onnx.__file__).resolve().parent
LIGHT_DIR = ONNX_DIR / "backend" / "test" / "data" / "light"
REAL_DIR = ONNX_DIR / "backend" / "test" / "data" / "real"


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_meta(case_dir: Path, rtol: float, atol: float) -> None:
    text = json.dumps({"rtol": float(rtol), "atol": float(atol)}, sort_keys=True)
    write_bytes(case_dir / "meta.json", (text + "\n").encode())


def serialize_value(value, vi: onnx.ValueInfoProto) -> tuple[bytes, str]:
    """Serialize one test value as cmd_tools.generate_data does.

    Returns the bytes and the kind written ("tensor", "sequence", ...).
    """
    t = vi.type
    if t.HasField("map_type"):
        return numpy_helper.from_dict(value, vi.name).SerializeToString(), "map"
    if t.HasField("sequence_type"):
        return numpy_helper.from_list(value, vi.name).SerializeToString(), "sequence"
    if t.HasField("optional_type"):
        return (
            numpy_helper.from_optional(value, vi.name).SerializeToString(),
            "optional",
        )
    if not t.HasField("tensor_type"):
        raise ValueError(f"value info {vi.name!r} has unsupported type {t}")
    if isinstance(value, TensorProto):
        return value.SerializeToString(), "tensor"
    return numpy_helper.from_array(value, vi.name).SerializeToString(), "tensor"


def gen_node(out: Path, stats: dict) -> int:
    np.random.seed(0)
    with warnings.catch_warnings():
        # Some case definitions deliberately overflow / divide by zero.
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)

    names = set()
    for case in cases:
        if case.name in names:
            raise ValueError(f"duplicate node test name {case.name!r}")
        names.add(case.name)
        assert case.model is not None and case.data_sets
        case_dir = out / case.name
        write_bytes(case_dir / "model.onnx", case.model.SerializeToString())
        write_meta(case_dir, case.rtol, case.atol)
        graph = case.model.graph
        for k, (inputs, outputs) in enumerate(case.data_sets):
            ds = case_dir / f"test_data_set_{k}"
            ds.mkdir(parents=True, exist_ok=True)
            for side, values, vis in (
                ("input", inputs, graph.input),
                ("output", outputs, graph.output),
            ):
                for i, value in enumerate(values):
                    data, kind = serialize_value(value, vis[i])
                    write_bytes(ds / f"{side}_{i}.pb", data)
                    if kind != "tensor":
                        stats.setdefault(f"{kind} {side}s", set()).add(case.name)
                    elif isinstance(value, TensorProto):
                        stats.setdefault(f"TensorProto {side}s", set()).add(case.name)
    return len(cases)


def light_tolerances() -> dict[str, tuple[float, float]]:
    """rtol/atol per light model, from onnx's data/real/*/data.json (what the
    runner uses for `onnx/backend/test/data/light/...` urls)."""
    tols = {}
    if REAL_DIR.is_dir():
        for data_json in sorted(REAL_DIR.glob("*/data.json")):
            data = json.loads(data_json.read_text())
            url = data.get("url", "")
            prefix = "onnx/backend/test/data/light/light_"
            if url.startswith(prefix) and url.endswith(".onnx"):
                name = url[len(prefix) : -len(".onnx")]
                tols[name] = (
                    data.get("rtol", DEFAULT_RTOL),
                    data.get("atol", DEFAULT_ATOL),
                )
    return tols


def dummy_input(x: onnx.ValueInfoProto) -> np.ndarray:
    """`Runner.generate_dummy_data(x, random=False)`."""
    if x.type.tensor_type.elem_type != TensorProto.FLOAT:
        raise NotImplementedError(f"light model input {x.name!r} is not float32")
    shape = tuple(
        d.dim_value if d.HasField("dim_value") else 1
        for d in x.type.tensor_type.shape.dim
    )
    n = np.prod(shape)
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def gen_light(out: Path) -> int:
    tols = light_tolerances()
    count = 0
    for model_path in sorted(LIGHT_DIR.glob("light_*.onnx")):
        name = model_path.stem[len("light_") :]
        case_dir = out / name
        ds = case_dir / "test_data_set_0"
        ds.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model_path, case_dir / "model.onnx")
        model = onnx.load(str(model_path))
        inits = {i.name for i in model.graph.initializer}
        n_input = 0
        for x in model.graph.input:
            if x.name in inits:
                continue
            value = dummy_input(x)
            # The runner writes these unnamed: from_array(value).
            write_bytes(
                ds / f"input_{n_input}.pb",
                numpy_helper.from_array(value).SerializeToString(),
            )
            n_input += 1
        for i in range(len(model.graph.output)):
            ref = LIGHT_DIR / f"light_{name}_output_{i}.pb"
            if not ref.exists():
                raise FileNotFoundError(f"missing expected output {ref}")
            shutil.copyfile(ref, ds / f"output_{i}.pb")
        rtol, atol = tols.get(name, (DEFAULT_RTOL, DEFAULT_ATOL))
        write_meta(case_dir, rtol, atol)
        count += 1
    return count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="output directory (default: %(default)s)",
    )
    args = ap.parse_args()
    out: Path = args.out.resolve()
    t0 = time.monotonic()

    # Build into a staging dir, then replace node/ and light/ wholesale so a
    # rerun never leaves stale cases behind and a failed run leaves no half
    # tree in place.
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".staging-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    try:
        stats: dict[str, set[str]] = {}
        n_node = gen_node(staging / "node", stats)
        n_light = gen_light(staging / "light")
        for sub in ("node", "light"):
            dst = out / sub
            if dst.exists():
                shutil.rmtree(dst)
            (staging / sub).rename(dst)
    finally:
        if staging.exists():
            shutil.rmtree(staging)

    n_files = sum(1 for _ in out.rglob("*.pb"))
    print(f"onnx {onnx.__version__}, numpy {np.__version__}")
    print(f"node tests:  {n_node}")
    print(f"light tests: {n_light}")
    for key in sorted(stats):
        print(f"  node tests with {key}: {len(stats[key])}")
    print(f".pb files:   {n_files}")
    print(f"wrote {out} in {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
