"""Tables of one GPU run of the tensor-core GEMM benchmark.

Reads the JSON lines of `gemm_bench check`, `gemm_bench bench` and `bench/gemm_tc_peer.py`
(all from the same run) and writes bench/results/gemm-tc-DATE.json and .md.
usage: python3 bench/gemm_tc_report.py DIR DATE [--command TEXT]
(DIR holds check.jsonl, bench.jsonl, peer.jsonl)"""
import argparse
import json
import os


def lines(path):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("date")
    ap.add_argument("--command", default="")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    check = lines(os.path.join(a.dir, "check.jsonl"))
    bench = lines(os.path.join(a.dir, "bench.jsonl"))
    peer = lines(os.path.join(a.dir, "peer.jsonl"))
    device = next((j for j in check + bench if "device" in j), {})
    peer_info = next((j for j in peer if "peer" in j), {})
    cublas = {j["label"]: j for j in peer if j.get("impl") == "cublas"}
    linear_gelu = {j["label"]: j for j in peer if j.get("impl") == "torch_linear_gelu"}
    split_accum = {j["label"]: j for j in peer if j.get("impl") == "cublas_split_accum"}
    peer_errors = [j for j in peer if "error" in j]
    checks = [j for j in check if "label" in j]
    rows = []
    for j in bench:
        if "label" not in j:
            continue
        base = j["label"]
        for suffix in ["_k2"]:
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        if base.startswith("gemm_bf16_8192_") and base != "gemm_bf16_8192_rc":
            base = "gemm_bf16_8192"
        peer_j = cublas.get(base, {})
        r = {k: j.get(k) for k in ["label", "kernel", "m", "n", "k", "batch", "dtype", "out", "layouts",
                                     "params", "grid", "ok", "max_err", "rel_l2", "ms", "tflops", "tb_s", "regs",
                                     "local_bytes"]}
        r["peer_label"] = base
        r["cublas_ms"] = peer_j.get("ms")
        r["cublas_tflops"] = peer_j.get("tflops")
        r["cublas_tb_s"] = peer_j.get("tb_s")
        if r["tflops"] and r["cublas_tflops"]:
            r["vs_cublas"] = r["tflops"] / r["cublas_tflops"]
        if base in linear_gelu:
            r["torch_linear_gelu_tflops"] = linear_gelu[base]["tflops"]
        if base in split_accum:
            r["cublas_split_accum_tflops"] = split_accum[base]["tflops"]
        rows.append(r)
    # Peer shapes with no tilec row here (gemm_f32_8192: exact f32, the SIMT GEMM's peer).
    ours = {r["peer_label"] for r in rows}
    peer_only = [j for j in peer if j.get("impl") == "cublas" and "tflops" in j and j["label"] not in ours]
    result = {"date": a.date, "device": device, "peer": peer_info, "command": a.command,
              "checks": checks, "bench": rows, "peer_only": peer_only, "peer_errors": peer_errors}
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"gemm-tc-{a.date}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=2)
    md = [f"# Tensor-core GEMM (Hopper, sm_90a), {a.date}", ""]
    md.append(f"{device.get('device', '?')} ({device.get('sms', '?')} SMs), NVRTC {device.get('nvrtc', '?')}, "
              f"driver {device.get('driver', '?')}; peer: cuBLAS through PyTorch {peer_info.get('torch', '?')} "
              "(`torch.matmul`), measured in the same run. TFLOP/s from the median of CUDA-event timings; "
              "max_err is max |out - ref| / max |ref| against an f64 reference on the CPU (all elements of "
              "small problems, 3000 sampled ones plus the corners of large ones; every element also "
              "checked to be written).")
    md.append("")
    if a.command:
        md += ["Command:", "", "```", a.command, "```", ""]
    md.append("| workload | M×N×K | layouts | params | grid | ok | max_err | tilec TFLOP/s | cuBLAS TFLOP/s | × cuBLAS |")
    md.append("| --- | --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        vs = f"{r['vs_cublas']:.2f}" if r.get("vs_cublas") else ""
        cb = f"{r['cublas_tflops']:.0f}" if r.get("cublas_tflops") else ""
        tf = f"{r['tflops']:.0f}" if r.get("tflops") else ""
        if r["label"].startswith("gemv"):
            tf += f" ({r['tb_s']:.2f} TB/s)" if r.get("tb_s") else ""
            cb += f" ({r['cublas_tb_s']:.2f} TB/s)" if r.get("cublas_tb_s") else ""
        md.append(f"| {r['label']} | {r['m']}×{r['n']}×{r['k']} | {r['layouts']} | {r['params']} | {r['grid']} | "
                  f"{r['ok']} | {r['max_err']:.1e} | {tf} | {cb} | {vs} |")
    for r in rows:
        if r.get("cublas_split_accum_tflops"):
            md.append("")
            md.append(f"{r['label']}: the cuBLAS column is `torch._scaled_mm` with `use_fast_accum=True` (products "
                      f"summed in the tensor cores' accumulator, as tilec's kernel does); without fast accumulation "
                      f"(partial sums promoted to f32) it ran at {r['cublas_split_accum_tflops']:.0f} TFLOP/s.")
    if peer_only:
        md += ["", "Peer only (no tilec tensor-core row; exact f32 is the SIMT GEMM's peer):", "",
               "| workload | impl | ms | TFLOP/s |", "| --- | --- | ---: | ---: |"]
        for j in peer_only:
            md.append(f"| {j['label']} | {j['impl']} | {j['ms']:.3f} | {j['tflops']:.1f} |")
    for j in peer_errors:
        md.append("")
        md.append(f"peer {j.get('label')} ({j.get('impl')}) failed: {j['error']}")
    lg = [r for r in rows if r.get("torch_linear_gelu_tflops")]
    for r in lg:
        md.append("")
        md.append(f"{r['label']}: tilec fuses bias + GELU in the epilogue; cuBLAS is timed without the epilogue "
                  f"(the issue's peer); PyTorch's `gelu(linear(a, w, bias))` ran at "
                  f"{r['torch_linear_gelu_tflops']:.0f} TFLOP/s.")
    md += ["", f"Correctness cases ({sum(1 for c in checks if c.get('ok'))}/{len(checks)} passed):", "",
           "| case | M×N×K×batch | dtype → out | layouts | params | ok | max_err | rel_l2 |",
           "| --- | --- | --- | --- | --- | --- | ---: | ---: |"]
    for c in checks:
        if "max_err" not in c:
            md.append(f"| {c['label']} | {c.get('m')}×{c.get('n')}×{c.get('k')} | | {c.get('layouts')} | | "
                      f"{c.get('ok')} | {c.get('error', '')} | |")
            continue
        dt = c["dtype"]
        if c.get("b_dtype") and c["b_dtype"] != dt and dt != "tf32":
            dt += f"×{c['b_dtype']}"
        if c.get("scales"):
            dt += f" (scales {c['scales']})"
        md.append(f"| {c['label']} | {c['m']}×{c['n']}×{c['k']}×{c['batch']} | {dt} → {c['out']} | "
                  f"{c['layouts']} | {c['params']} | {c['ok']} | {c['max_err']:.1e} | {c['rel_l2']:.1e} |")
    with open(base + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print(base + ".md")


if __name__ == "__main__":
    main()
