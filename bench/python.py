#!/usr/bin/env python3
"""Python benchmark: tilec's Python package against torch.compile's Inductor on the CPU and
onnxruntime's Python session, on the same models in one run; and the per-call overhead of
`CompiledModel.run` over the CLI's time for the same model.

Run from the repository root after scripts/test-python.sh (which builds the package into
.venv-py and gives it PyTorch, transformers and onnxruntime):

    .venv-py/bin/python bench/python.py

Writes bench/results/python-YYYY-MM-DD.json and .md. Every peer runs with the same number of
threads (--threads, default 2), on the same inputs, timed the same way: warm-up calls, then
the median of N timed calls from Python, the peers interleaved in rounds. Each model is a PyTorch module; Inductor compiles it
directly, tilec and onnxruntime get its ONNX export (the dynamo exporter), and
torch.compile(backend="tilec") is timed too. Outputs are checked against eager PyTorch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, runs: int, warmup: int) -> float:
    """Median milliseconds of `runs` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def models(torch):
    """(name, module, example inputs): a GPT-2 as models/gpt2 (same config, random weights) and
    a ResNet-18-shaped CNN."""
    import transformers

    sys.path.insert(0, str(ROOT / "tests" / "python"))
    from test_torch_compile import BasicBlock, randomized  # noqa: E402

    cfg = transformers.GPT2Config(vocab_size=1024, n_positions=128, n_embd=256, n_layer=4, n_head=4,
                                  use_cache=False, attn_implementation="eager")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids).logits

    nn = torch.nn

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            chans = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]
            self.blocks = nn.Sequential(*[BasicBlock(a, b, s) for a, b, s in chans])
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))

    g = torch.Generator().manual_seed(1)
    yield "gpt2 (b1, s64)", Logits(gpt2), (torch.randint(0, 1024, (1, 64), generator=g),)
    yield "resnet18 (b1, 224)", randomized(ResNet18()), (torch.randn(1, 3, 224, 224, generator=g),)


def to_onnx(torch, module, args) -> bytes:
    import logging

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(module, args, dynamo=True, verbose=False)
    return prog.model_proto.SerializeToString()


BLOCK = 5


def interleaved(fns: dict, runs: int, warmup: int) -> dict:
    """Median milliseconds of `runs` calls of each callable, timed in rounds of `BLOCK` calls of
    each peer, every block after `warmup` untimed calls: a change in the machine's load weighs
    on every peer alike, and one peer's idle threads (PyTorch, onnxruntime and tilec each have
    their own pool) have settled before the next peer's timed calls."""
    ts = {k: [] for k in fns}
    for _ in range(max(1, runs // BLOCK)):
        for k, fn in fns.items():
            for _ in range(warmup):
                fn()
            for _ in range(BLOCK):
                t = time.perf_counter()
                fn()
                ts[k].append((time.perf_counter() - t) * 1e3)
    return {k: statistics.median(v) for k, v in ts.items()}


def bench_model(torch, tilec, ort, name, module, args, a) -> dict:
    """Compiles the model with every peer (compile times and errors against eager recorded),
    then times them interleaved."""
    rec = {"model": name}
    fns = {}
    with torch.no_grad():
        want = module(*args)
        fns["eager"] = lambda: module(*args)
        onnx_bytes = to_onnx(torch, module, args)
        feeds = [x.numpy() for x in args]

        t = time.perf_counter()
        m = tilec.compile(onnx_bytes, threads=a.threads)
        (got,) = m.run(feeds)
        rec["tilec_compile_s"] = time.perf_counter() - t
        rec["tilec_max_abs_err"] = float(np.abs(got - want.numpy()).max())
        fns["tilec"] = lambda: m.run(feeds)

        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        s = ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
        ort_feeds = dict(zip([i.name for i in s.get_inputs()], feeds))
        (got,) = s.run(None, ort_feeds)
        rec["ort_max_abs_err"] = float(np.abs(got - want.numpy()).max())
        fns["ort"] = lambda: s.run(None, ort_feeds)

        for backend in ("inductor", "tilec"):
            c = torch.compile(module, backend=backend)
            t = time.perf_counter()
            try:
                got = c(*args)
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                rec[f"torch_{backend}_error"] = str(e).splitlines()[0][:300]
                continue
            rec[f"torch_{backend}_compile_s"] = time.perf_counter() - t
            rec[f"torch_{backend}_max_abs_err"] = float((got - want).abs().max())
            fns[f"torch_{backend}"] = lambda c=c: c(*args)

        for k, ms in interleaved(fns, a.runs, a.warmup).items():
            rec[f"{k}_ms"] = ms
    return rec


def overhead(tilec, a) -> list[dict]:
    """`CompiledModel.run` against the CLI's median on the same model and inputs: a tiny model
    (where the time is nearly all overhead) and models/gpt2."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    tiny = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
            "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
            [numpy_helper.from_array(np.ones((1, 16), np.float32), "b")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    out = []
    with tempfile.TemporaryDirectory() as d:
        tiny_path = Path(d) / "tiny.onnx"
        onnx.save(tiny, tiny_path)
        cases = [
            ("tiny add+relu [1,16]", tiny_path, {"x": np.zeros((1, 16), np.float32)}),
            ("gpt2 (b1, s64)", ROOT / "models" / "gpt2" / "model.onnx",
             {"input_ids": np.random.default_rng(0).integers(0, 1024, (1, 64), dtype=np.int64)}),
        ]
        for name, path, feeds in cases:
            m = tilec.compile(path, threads=a.threads)
            m.run(feeds)
            runs = max(a.runs, 2000) if "tiny" in name else a.runs
            args = [str(ROOT / "target" / "release" / "tilec"), "run", str(path), "--threads", str(a.threads),
                    "--bench", str(runs), "--json"]
            for k, v in feeds.items():
                np.save(Path(d) / f"{k}.npy", v)
                args += ["--input", f"{k}={Path(d) / f'{k}.npy'}"]
            # Alternated three times (the median of each side's medians), as the load drifts.
            py, cli = [], []
            for _ in range(3):
                py.append(timed(lambda: m.run(feeds), runs, a.warmup))
                r = subprocess.run(args, capture_output=True, text=True)
                try:
                    cli.append(json.loads(r.stdout.strip().splitlines()[-1])["median_ms"])
                except (ValueError, KeyError, IndexError):
                    pass
            py_ms = statistics.median(py)
            cli_ms = statistics.median(cli) if cli else None
            out.append({
                "model": name, "python_run_ms": py_ms, "cli_ms": cli_ms,
                "overhead_us": None if cli_ms is None else (py_ms - cli_ms) * 1e3, "runs": runs,
            })
    return out


def machine(torch, ort, tilec) -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__, "tilec": tilec.__version__,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def fmt(x, spec=".2f"):
    return "—" if x is None else format(x, spec)


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [
        f"# Python benchmark, {res['date']}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['os']}; Python {m['python']}, torch {m['torch']}, "
        f"onnxruntime {m['onnxruntime']}, tilec {m['tilec']}; load average at the start {m['load_average_at_start']}. "
        f"All peers measured in this run with {res['threads']} threads, from Python: median of {res['runs']} calls "
        f"in rounds: each round times {BLOCK} calls of each peer after {res['warmup']} untimed ones, so that "
        f"load from other processes weighs on all alike.",
        "",
        "## Model latency (ms)",
        "",
        "| model | eager | Inductor | torch.compile(tilec) | tilec.compile | onnxruntime | tilec vs Inductor | tilec vs ort |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in res["models"]:
        ind, tl, ot = r.get("torch_inductor_ms"), r.get("tilec_ms"), r.get("ort_ms")
        lines.append(
            f"| {r['model']} | {fmt(r.get('eager_ms'))} | {fmt(ind)} | {fmt(r.get('torch_tilec_ms'))} | {fmt(tl)} | "
            f"{fmt(ot)} | {fmt(ind / tl if ind and tl else None)}x | {fmt(ot / tl if ot and tl else None)}x |"
        )
    lines += ["", "Max abs error against eager: " + "; ".join(
        f"{r['model']}: tilec {fmt(r.get('tilec_max_abs_err'), '.1e')}, ort {fmt(r.get('ort_max_abs_err'), '.1e')}, "
        f"Inductor {fmt(r.get('torch_inductor_max_abs_err'), '.1e')}, torch.compile(tilec) {fmt(r.get('torch_tilec_max_abs_err'), '.1e')}"
        for r in res["models"]) + ".", ""]
    errs = [f"{r['model']}: {k} {v}" for r in res["models"] for k, v in r.items() if k.endswith("_error")]
    if errs:
        lines += ["Errors: " + "; ".join(errs), ""]
    lines += ["## `CompiledModel.run` overhead over the CLI", "",
              "| model | Python `run` ms | `tilec run --bench` ms | overhead µs |", "| --- | ---: | ---: | ---: |"]
    for r in res["overhead"]:
        lines.append(f"| {r['model']} | {fmt(r['python_run_ms'], '.4f')} | {fmt(r['cli_ms'], '.4f')} | {fmt(r['overhead_us'], '.1f')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args()
    import onnxruntime as ort
    import torch

    import tilec

    torch.set_num_threads(a.threads)
    res = {"date": dt.date.today().isoformat(), "threads": a.threads, "runs": a.runs, "warmup": a.warmup,
           "machine": machine(torch, ort, tilec), "models": [], "overhead": overhead(tilec, a)}
    print(json.dumps(res["overhead"]), flush=True)
    torch._dynamo.reset()
    for name, module, args in models(torch):
        rec = bench_model(torch, tilec, ort, name, module, args, a)
        print(json.dumps(rec), flush=True)
        res["models"].append(rec)
    a.out.mkdir(parents=True, exist_ok=True)
    stem = a.out / f"python-{res['date']}"
    stem.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
