#!/usr/bin/env python3
"""Turns the output of scripts/gpu-models-tc into bench/results/models-tc-DATE.{json,md} and
merges the model workloads (and the GEMM workloads of bench/results/gemm-tc-DATE.json) into
bench/results/gpu-summary.json (an existing one is kept under a dated name first).

    python3 bench/models_tc_report.py RUNDIR DATE [ABDIR]

ABDIR (optional): the OUTDIR of a `GPU_MODELS_AB=1 scripts/gpu-models-tc` run, whose ab.txt
(GPT-2 b8s512 with the families on and off at -O3, and on at -O2) is added as its own table.
"""

import json
import shutil
import sys
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"
# (model, shape) -> (summary workload, model description, torch.compile mode of the peer)
WORKLOADS = {
    ("gpt2", "b8s512"): ("gpt2s_f16_b8s512", "GPT-2 small f16, batch 8 x 512", "default"),
    ("gpt2", "b1s128"): ("gpt2s_f16_b1s128", "GPT-2 small f16, batch 1 x 128", "reduce-overhead"),
    ("bert", "b8s512"): ("bertb_f16_b8s512", "BERT-base f16, batch 8 x 512", "default"),
    ("resnet50", "b64"): ("resnet50_f16_b64", "ResNet-50 f16, batch 64", "default"),
}
GEMM = ["gemm_bf16_8192", "gemm_bf16_4096", "gemm_f16_8192", "gemm_bias_gelu_bf16_8192x4096x16384",
        "gemv_bf16_16x8192x8192"]


def lines(p):
    return [json.loads(l) for l in open(p) if l.strip().startswith("{")] if p.is_file() else []


def main():
    run, date = Path(sys.argv[1]), sys.argv[2]
    torch = {(r["model"], r["shape"]): r for r in lines(run / "torch.jsonl") if "shape" in r}
    tilec = {(r["model"], r["shape"]): r for r in lines(run / "tilec.jsonl")}
    cmp = {(r["model"], r["shape"]): r for r in lines(run / "compare.jsonl")}
    gpu = (run / "gpu.txt").read_text().splitlines() if (run / "gpu.txt").is_file() else []
    rows = []
    for key, (wl, desc, mode) in WORKLOADS.items():
        t, p, c = tilec.get(key, {}), torch.get(key, {}), cmp.get(key, {})
        rows.append({
            "workload": wl, "model": desc, "tilec_ms": t.get("median_ms"), "eager_ms": p.get("eager_ms"),
            "compile_ms": p.get(f"compile_{mode}_ms"), "compile_mode": mode,
            "rel_err": c.get("rel_err"), "max_abs_err": c.get("max_abs_err"), "nan": c.get("nan"),
            "compile_rel_err": p.get(f"compile_{mode}_rel_err"), "kernels": t.get("kernels"),
            "schedules": t.get("schedules"), "families": t.get("families"), "host_nodes": t.get("host_nodes"),
            "tilec_compile_ms": t.get("compile_ms"), "rc": t.get("rc"), "error": c.get("error"),
        })
    out = {"date": date, "device": gpu, "results": rows}
    (RES / f"models-tc-{date}.json").write_text(json.dumps(out, indent=1) + "\n")

    f = lambda x, d=2: "—" if x is None else f"{x:.{d}f}"
    md = [f"# 16-bit models on the GPU with the tensor-core GEMM family, {date}", "",
          f"Device: {' / '.join(gpu[1:]) or 'unknown'}. One run: the models were built from their",
          "transformers/torchvision configs with random weights in f16 and exported on the GPU machine",
          "(`scripts/export-gpu-models.py`), then `scripts/gpu-models-tc` ran `tilec run --target cuda",
          "--bench 20` on the same inputs (median of 20, CUDA events, inputs resident) and compared the",
          "outputs with PyTorch eager's (norm-relative error). PyTorch eager and torch.compile were timed",
          "in the same run (median of 20 after warm-up, CUDA events).", "",
          "| model | tilec ms | PyTorch eager ms | torch.compile ms (mode) | tilec / compile | rel. err vs eager | torch.compile's rel. err | matrix-product kernels on the family |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        s = r["schedules"] or {}
        fam = s.get("sm90_tc_gemm", 0)
        other = s.get("gemm", 0)
        ratio = r["tilec_ms"] / r["compile_ms"] if r["tilec_ms"] and r["compile_ms"] else None
        md.append(f"| {r['model']} | {f(r['tilec_ms'])} | {f(r['eager_ms'])} | {f(r['compile_ms'])} ({r['compile_mode']}) | "
                  f"{f(ratio, 1)}x | {f(r['rel_err'], 4) if r['rel_err'] is not None else r['error']} | "
                  f"{f(r['compile_rel_err'], 4)} | {fam} of {fam + other} |")
    if len(sys.argv) > 3 and (Path(sys.argv[3]) / "ab.txt").is_file():
        import re

        ab, cur = [], None
        for line in (Path(sys.argv[3]) / "ab.txt").read_text().splitlines():
            m = re.match(r"== families (\w+), -O(\d)", line)
            if m:
                cur = {"families": m.group(1), "opt_level": int(m.group(2))}
            m = re.search(r"median ([\d.]+) ms", line)
            if m and cur:
                cur["median_ms"] = float(m.group(1))
                ab.append(cur)
            m = re.search(r"compiled (\d+) GPU kernels \(([^;]*);", line)
            if m and cur:
                cur["kernels"], cur["schedules"] = int(m.group(1)), m.group(2)
        out["gpt2_b8s512_ab"] = ab
        (RES / f"models-tc-{date}.json").write_text(json.dumps(out, indent=1) + "\n")
        md += ["", "GPT-2 small f16 at batch 8 x 512 in a second run (same export procedure, no PyTorch",
               "timings; `GPU_MODELS_AB=1 scripts/gpu-models-tc`): the kernel families on and off (`TILEC_CUDA_FAMILIES=off`) at -O3, and on at -O2,",
               "where attention is not recognized as one operation (its two matrix products and its softmax",
               "run as separate kernels):", "",
               "| families | level | tilec ms | kernels (schedules) |", "| --- | --- | ---: | --- |"]
        for r in ab:
            md.append(f"| {r['families']} | -O{r['opt_level']} | {r['median_ms']:.2f} | {r.get('kernels')} ({r.get('schedules')}) |")
    (RES / f"models-tc-{date}.md").write_text("\n".join(md) + "\n")

    # gpu-summary.json
    summ = RES / "gpu-summary.json"
    if summ.is_file():
        old = json.loads(summ.read_text())
        if old.get("date") != date:
            shutil.copy(summ, RES / f"gpu-summary-{old.get('date', 'old')}.json")
    results = []
    gemm = json.loads((RES / f"gemm-tc-{date}.json").read_text()) if (RES / f"gemm-tc-{date}.json").is_file() else {}
    for b in gemm.get("bench", []):
        if b["label"] in GEMM and b["label"] not in [r["workload"] for r in results]:
            tb = b["label"].startswith("gemv")
            results.append({"workload": b["label"], "unit": "TB/s" if tb else "TFLOP/s",
                            "tilec": round(b["tb_s"] if tb else b["tflops"], 2),
                            "peer": round(b["cublas_tb_s"] if tb else b["cublas_tflops"], 2),
                            "peer_name": f"cuBLAS via torch {gemm.get('peer', {}).get('torch', '')}".strip(),
                            "ok": b["ok"]})
    for r in rows:
        if r["tilec_ms"] is None:
            continue
        results.append({"workload": r["workload"], "unit": "ms", "tilec": round(r["tilec_ms"], 3),
                        "peer": round(r["compile_ms"], 3) if r["compile_ms"] else None,
                        "peer_name": f"torch.compile ({r['compile_mode']}) in the same run",
                        "eager_ms": round(r["eager_ms"], 3) if r["eager_ms"] else None,
                        "ok": r["rel_err"] is not None and r["rel_err"] < 0.01 and not r["nan"]})
    dev = gpu[1].split(",")[0] if len(gpu) > 1 else "unknown"
    summ.write_text(json.dumps({"date": date, "device": dev, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
