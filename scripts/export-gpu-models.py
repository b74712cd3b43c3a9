#!/usr/bin/env python3
"""Exports the GPU benchmark models and times PyTorch on them, on a GPU machine.

For each model: build it from its transformers/torchvision config with random weights (seeded),
in f16 on the GPU; export it to ONNX with PyTorch's dynamo exporter (symbolic batch and sequence
for the transformers); for each benchmark shape save the inputs and PyTorch's outputs as .npy
(the check `tilec run --input ... --expect ...` compares against); and time PyTorch eager and
torch.compile (the modes SHAPES names) on the same inputs with CUDA events (median of
20 runs after warm-up).

    python3 scripts/export-gpu-models.py OUTDIR [gpt2|bert|resnet50 ...]

writes OUTDIR/<model>/model.onnx (+ .data), OUTDIR/<model>/<shape>/{inputs,expected}/*.npy and
one JSON line per shape to OUTDIR/torch.jsonl (with each torch.compile mode's first call, its
compile, in seconds). Nothing is downloaded: weights are random. The transformers use their
default attention implementation (SDPA), as users export them; GPU_ATTN=eager selects
transformers' eager attention instead. EXPORT_ONLY=1 skips the timings (with EXPORT_DEVICE=cpu
it exports without a GPU and writes no expected outputs: f16 on the CPU takes too long);
EXPORT_SHAPES=b8s512,... keeps only those shapes; TORCH_MODES=default,max-autotune replaces
the modes timed at every shape.
"""

import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

RUNS = 20
SEED = 0

# name -> list of (shape tag, batch, seq or image size, torch.compile modes timed)
SHAPES = {
    "gpt2": [("b8s512", 8, 512, ["default", "max-autotune"]), ("b1s128", 1, 128, ["reduce-overhead"])],
    "bert": [("b8s512", 8, 512, ["default"])],
    "resnet50": [("b64", 64, 224, ["default"])],
}
ATTN = os.environ.get("GPU_ATTN", "sdpa")


def build(name):
    if name == "gpt2":
        import transformers

        cfg = transformers.GPT2Config(use_cache=False, attn_implementation=ATTN)
        return transformers.GPT2LMHeadModel(cfg), ["input_ids"], ["logits"]
    if name == "bert":
        import transformers

        cfg = transformers.BertConfig(attn_implementation=ATTN)
        m = transformers.BertModel(cfg, add_pooling_layer=False)
        return m, ["input_ids", "attention_mask"], ["last_hidden_state"]
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(), ["input"], ["output"]
    raise SystemExit(f"unknown model {name}")


def inputs_for(name, batch, size, rng):
    if name == "resnet50":
        return {"input": rng.standard_normal((batch, 3, size, size)).astype(np.float16)}
    ids = rng.integers(0, 30000, size=(batch, size), dtype=np.int64)
    if name == "bert":
        return {"input_ids": ids, "attention_mask": np.ones((batch, size), dtype=np.int64)}
    return {"input_ids": ids}


class Wrap1(torch.nn.Module):
    """One input, one tensor output (the exporter's and torch.compile's view)."""

    def __init__(self, m, out):
        super().__init__()
        self.m, self.out = m, out

    def forward(self, x):
        r = self.m(x)
        return r if isinstance(r, torch.Tensor) else r[self.out]


class Wrap2(Wrap1):
    def forward(self, input_ids, attention_mask):
        return self.m(input_ids, attention_mask)[self.out]


def timed(fn, args):
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(RUNS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*args)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return float(np.median(times))


def export(module, example, in_names, out_names, dynamic, path):
    shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1, max=1024)
        seq = torch.export.Dim("seq", min=2, max=1024)
        names = ["x"] if len(in_names) == 1 else in_names
        shapes = {n: {0: batch, 1: seq} for n in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            module, example, dynamo=True, input_names=in_names, output_names=out_names,
            dynamic_shapes=shapes, optimize=True, verbose=False,
        )
    prog.save(str(path), external_data=True)


def main():
    out = Path(sys.argv[1])
    names = sys.argv[2:] or list(SHAPES)
    torch.manual_seed(SEED)
    dev = torch.device(os.environ.get("EXPORT_DEVICE", "cuda"))
    on_cpu = dev.type == "cpu"
    if on_cpu and not os.environ.get("EXPORT_ONLY"):
        raise SystemExit("EXPORT_DEVICE=cpu needs EXPORT_ONLY=1 (nothing is timed on the CPU)")
    log = open(out / "torch.jsonl", "a")
    for name in names:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        m, in_names, out_names = build(name)
        wrap = Wrap1 if len(in_names) == 1 else Wrap2
        m = wrap(m.eval().half().to(dev), out_names[0]).eval()
        rng = np.random.default_rng(SEED)
        first = None
        only = os.environ.get("EXPORT_SHAPES", "").split(",")
        for tag, batch, size, modes in SHAPES[name]:
            if only != [""] and tag not in only:
                continue
            feeds = inputs_for(name, batch, size, rng)
            args = tuple(torch.from_numpy(feeds[n]).to(dev) for n in in_names)
            first = first or args
            (d / tag / "inputs").mkdir(parents=True, exist_ok=True)
            (d / tag / "expected").mkdir(parents=True, exist_ok=True)
            for n in in_names:
                np.save(d / tag / "inputs" / f"{n}.npy", feeds[n])
            rec = {"model": name, "shape": tag}
            if name != "resnet50":
                rec["attention"] = ATTN
            if os.environ.get("TORCH_MODES"):
                modes = os.environ["TORCH_MODES"].split(",")
            with torch.no_grad():
                if on_cpu:
                    print(json.dumps(rec), flush=True)
                    continue
                ref = m(*args)
                np.save(d / tag / "expected" / f"{out_names[0]}.npy", ref.float().cpu().numpy().astype(np.float16))
                if os.environ.get("EXPORT_ONLY"):
                    modes = []
                else:
                    rec["eager_ms"] = timed(m, args)
                for mode in modes:
                    try:
                        torch._dynamo.reset()
                        c = torch.compile(m, mode=mode)
                        t1 = time.time()
                        c(*args)
                        torch.cuda.synchronize()
                        rec[f"compile_{mode}_s"] = round(time.time() - t1, 2)
                        rec[f"compile_{mode}_ms"] = timed(c, args)
                        got = c(*args).float()
                        rec[f"compile_{mode}_rel_err"] = float((got - ref.float()).norm() / ref.float().norm())
                    except Exception as e:  # noqa: BLE001 - report and go on
                        rec[f"compile_{mode}_error"] = f"{type(e).__name__}: {e}"[:300]
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
        torch._dynamo.reset()
        dynamic = name != "resnet50"
        try:
            export(m, first, in_names, out_names, dynamic, d / "model.onnx")
        except Exception as e:  # noqa: BLE001 - a static export still checks the first shape
            print(json.dumps({"model": name, "dynamic_export_error": f"{type(e).__name__}: {e}"[:500]}), flush=True)
            dynamic = False
            export(m, first, in_names, out_names, False, d / "model.onnx")
        print(json.dumps({"model": name, "export_s": round(time.time() - t0, 1), "dynamic": dynamic}), flush=True)
        del m
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
