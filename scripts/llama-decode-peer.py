#!/usr/bin/env python3
"""The peer and the report of scripts/gpu-llama-decode.

    python3 scripts/llama-decode-peer.py peer WORK [--batches 1,16] [--new 128] [--device cuda] [--compile]
    python3 scripts/llama-decode-peer.py report WORK OUTDIR

`peer` loads the transformers checkpoint that scripts/export-llama-decode.py wrote to WORK/hf
(bf16) and, for each batch (the first B prompts of WORK/prompts.json):

- runs `model.generate` greedily for the new tokens (no end token: every prompt gets all of
  them) and keeps the tokens, and the logits of the prompt's last token in bf16 and with the
  model in f32 (WORK/hf-logits-bs<B>.npy, WORK/hf32-logits-bs<B>.npy);
- times `generate` with 1 new token (the prefill) and with all of them (median of 3 runs after
  warm-ups): decode tokens/s = B * (new - 1) / (total - prefill);
- with --compile, times it again with a static cache (transformers compiles its decode step
  with torch.compile on the first call, which the warm-up pays);

then measures the device's copy bandwidth (a 4 GiB device-to-device copy on a GPU, bytes read
plus bytes written per second; 256 MiB on the CPU) and the bytes of weights one decode step
reads (every parameter in its dtype, the embedding table only for the rows read unless it is
also the LM head): the weight-bandwidth limit is B * bandwidth / bytes tokens/s. Appends to
WORK/peer.json (one object per run, by batch).

`judge`, after tilec's runs, looks at each prompt whose tokens leave transformers': after the
common prefix, which of the two next tokens the model in f32 prefers, their f32 logits, and the
bf16 noise there (the largest difference between the bf16 and f32 models' logits): with random
weights the top logits often lie closer than that, so bf16 rounding alone picks either
(WORK/judge.json).

`report` reads those and tilec's runs (WORK/tilec-bs<B>.txt, the output of `tilec generate`,
and WORK/tilec-logits-bs<B>.npy, its --logits-out) and writes one JSON line per batch to
OUTDIR/llama-decode.jsonl: tilec's and the peers' decode and prefill tokens/s, the limit, the
tokens equal to transformers' (the common prefix of each prompt's continuation, summed, and the
first tokens), and the norm-relative error of the first-step logits against transformers' in
bf16 and in f32 (and bf16 against f32: how far bf16 alone moves them), and of the
divergences: how many lie within twice the bf16 noise, and how often tilec's or transformers'
token is the f32 model's choice.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import numpy as np


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def copy_bandwidth(device: str) -> float:
    """Bytes read plus bytes written per second by a device-to-device copy."""
    import torch

    n = (4 << 30) if device.startswith("cuda") else (256 << 20)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    a.fill_(1)
    b = torch.empty_like(a)
    b.copy_(a)
    runs = [timed(device, lambda: b.copy_(a)) for _ in range(10)]
    return 2 * n / statistics.median(runs)


def step_bytes(model, batch: int) -> int:
    """Bytes of weights one decode step of `batch` tokens reads."""
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is emb
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not tied:
        total -= emb.numel() * emb.element_size()
        total += batch * emb.shape[1] * emb.element_size()
    return total


def decode_rate(batch: int, new: int, total: float, prefill: float) -> float | None:
    """Tokens per second of the decode steps: `generate` of all new tokens less that of one."""
    return batch * (new - 1) / (total - prefill) if total > prefill else None


def peer(a) -> None:
    import torch
    import transformers

    work = a.work
    meta = json.loads((work / "prompts.json").read_text())
    model = transformers.LlamaForCausalLM.from_pretrained(work / "hf", dtype=torch.bfloat16).to(a.device).eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.bos_token_id = None, 0, None
    gc.do_sample, gc.temperature, gc.top_p, gc.top_k = False, None, None, None
    model32 = None
    bw = copy_bandwidth(a.device)
    # --compile: only the compiled peer's times (the reference and the eager times are peer.json's).
    records = []
    for batch in a.batches:
        ids = torch.tensor(meta["prompts"][:batch], device=a.device)
        mask = torch.ones_like(ids)

        def gen(n: int, **kw):
            with torch.no_grad():
                return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)

        rec = {"batch": batch, "new": a.new, "prompt_len": ids.shape[1], "device": a.device,
               "torch": torch.__version__, "transformers": transformers.__version__,
               "attn": model.config._attn_implementation, "copy_bytes_per_s": bw,
               "step_bytes": step_bytes(model, batch)}
        rec["limit_tok_s"] = batch * bw / rec["step_bytes"]
        if not a.compile:
            out = gen(a.new)
            rec["tokens"] = out[:, ids.shape[1]:].tolist()
            with torch.no_grad():
                logits = model(ids).logits[:, -1].float().cpu().numpy()
            np.save(work / f"hf-logits-bs{batch}.npy", logits)
            if model32 is None:
                model32 = transformers.LlamaForCausalLM.from_pretrained(work / "hf", dtype=torch.float32).to(a.device).eval()
            with torch.no_grad():
                np.save(work / f"hf32-logits-bs{batch}.npy", model32(ids).logits[:, -1].float().cpu().numpy())
            gen(1)
            prefill = statistics.median(timed(a.device, lambda: gen(1)) for _ in range(3))
            total = statistics.median(timed(a.device, lambda: gen(a.new)) for _ in range(3))
            rec.update(peer_prefill_s=prefill, peer_total_s=total, peer_prefill_tok_s=batch * ids.shape[1] / prefill,
                       peer_decode_tok_s=decode_rate(batch, a.new, total, prefill))
        else:
            t = time.perf_counter()
            gen(a.new, cache_implementation="static")
            rec["compiled_first_call_s"] = time.perf_counter() - t
            gen(1, cache_implementation="static")
            p2 = statistics.median(timed(a.device, lambda: gen(1, cache_implementation="static")) for _ in range(3))
            t2 = statistics.median(timed(a.device, lambda: gen(a.new, cache_implementation="static")) for _ in range(3))
            rec.update(compiled_prefill_s=p2, compiled_total_s=t2,
                       compiled_decode_tok_s=decode_rate(batch, a.new, t2, p2))
        print(json.dumps({k: v for k, v in rec.items() if k != "tokens"}), flush=True)
        records.append(rec)
    name = "peer-compiled.json" if a.compile else "peer.json"
    (work / name).write_text(json.dumps(records) + "\n")


def judge(a) -> None:
    """Where tilec's greedy tokens leave transformers', which of the two tokens the f32 model
    prefers after their common prefix, by how much, and how far bf16 alone moves the logits
    there (the largest difference between the bf16 and f32 models' logits)."""
    import torch
    import transformers

    work = a.work
    meta = json.loads((work / "prompts.json").read_text())
    peers = {r["batch"]: r for r in json.loads((work / "peer.json").read_text())}
    models = {dt: transformers.LlamaForCausalLM.from_pretrained(work / "hf", dtype=dt).to(a.device).eval()
              for dt in (torch.float32, torch.bfloat16)}
    out = {}
    for batch in a.batches:
        got, want = parse_tilec(work / f"tilec-bs{batch}.txt")["tokens"], peers.get(batch, {}).get("tokens")
        if not want or len(got) != len(want):
            continue
        rows = []
        for k, (g, w) in enumerate(zip(got, want)):
            n = common_prefix(g, w)
            if n >= min(len(g), len(w)):
                continue
            ids = torch.tensor([meta["prompts"][k] + g[:n]], device=a.device)
            with torch.no_grad():
                f, b = (models[dt](ids).logits[0, -1].float() for dt in (torch.float32, torch.bfloat16))
            rows.append({"prompt": k, "step": n, "tilec": g[n], "peer": w[n], "f32_tilec": float(f[g[n]]),
                         "f32_peer": float(f[w[n]]), "f32_argmax": int(f.argmax()),
                         "bf16_noise": float((f - b).abs().max())})
        out[batch] = rows
    (work / "judge.json").write_text(json.dumps(out) + "\n")
    print(json.dumps(out))


def parse_tilec(path: Path) -> dict:
    """The new tokens and speeds `tilec generate` printed."""
    r = {"tokens": []}
    if not path.is_file():
        return r
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("  new tokens:"):
            r["tokens"].append([int(x) for x in line.split(":", 1)[1].split()])
        elif m := re.match(r"prefill: (\d+) tokens in ([\d.]+) ms \(([\d.]+) tokens/s\)", line):
            r["prefill_tok_s"] = float(m.group(3))
        elif m := re.match(r"decode: (\d+) steps, (\d+) tokens in ([\d.]+) ms \(([\d.]+) tokens/s\)", line):
            r["decode_tok_s"] = float(m.group(4))
        elif m := re.match(r"warm-up runs \(untimed\): ([\d.]+) ms", line):
            r["warmup_ms"] = float(m.group(1))
        elif m := re.search(r"graphs built in ([\d.]+) s", line):
            r["compile_s"] = float(m.group(1))
        elif "error" in line.lower() and "error" not in r:
            r["error"] = line.strip()[:300]
    return r


def rel_err(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.shape != b.shape:
        return None
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def common_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def report(a) -> None:
    work, out = a.work, a.outdir
    meta = json.loads((work / "prompts.json").read_text())
    peers = {r["batch"]: r for r in json.loads((work / "peer.json").read_text())} if (work / "peer.json").is_file() else {}
    comp = {}
    if (work / "peer-compiled.json").is_file():
        comp = {r["batch"]: r for r in json.loads((work / "peer-compiled.json").read_text())}
    judged = json.loads((work / "judge.json").read_text()) if (work / "judge.json").is_file() else {}
    name = "llama1b" if meta["config"] == "1b" else f"llama-{meta['config']}"
    lines = []
    for batch in a.batches:
        t = parse_tilec(work / f"tilec-bs{batch}.txt")
        p = peers.get(batch, {})
        rec = {"workload": f"{name}_decode_bs{batch}", "unit": "tok/s", "tilec": t.get("decode_tok_s"),
               "peer": p.get("peer_decode_tok_s"), "peer_name": "transformers generate (bf16, dynamic cache, "
               f"{p.get('attn', '?')} attention)", "limit_tok_s": p.get("limit_tok_s"),
               "tilec_prefill_tok_s": t.get("prefill_tok_s"), "peer_prefill_tok_s": p.get("peer_prefill_tok_s"),
               "tilec_compile_s": t.get("compile_s"), "tilec_warmup_ms": t.get("warmup_ms")}
        if batch in comp and "compiled_decode_tok_s" in comp[batch]:
            rec["peer_compiled"] = comp[batch]["compiled_decode_tok_s"]
            rec["peer_compiled_name"] = "transformers generate (static cache, torch.compile)"
        if "copy_bytes_per_s" in p:
            rec["copy_gb_s"] = p["copy_bytes_per_s"] / 1e9
            rec["step_weight_bytes"] = p["step_bytes"]
        if t.get("error"):
            rec["tilec_error"] = t["error"]
        want = p.get("tokens")
        if want and t["tokens"]:
            got = t["tokens"]
            rec["tokens_compared"] = sum(len(w) for w in want)
            rec["tokens_match_prefix"] = sum(common_prefix(g, w) for g, w in zip(got, want)) if len(got) == len(want) else 0
            rec["first_tokens_match"] = sum(g[:1] == w[:1] for g, w in zip(got, want))
            rec["prompts_all_match"] = sum(g == w for g, w in zip(got, want))
        div = judged.get(str(batch))
        if div is not None:
            rec["divergences"] = len(div)
            rec["divergences_within_bf16_noise"] = sum(abs(d["f32_tilec"] - d["f32_peer"]) <= 2 * d["bf16_noise"] for d in div)
            rec["divergences_tilec_is_f32_argmax"] = sum(d["tilec"] == d["f32_argmax"] for d in div)
            rec["divergences_peer_is_f32_argmax"] = sum(d["peer"] == d["f32_argmax"] for d in div)
        lt, lh, l32 = (work / f"{n}-logits-bs{batch}.npy" for n in ("tilec", "hf", "hf32"))
        if lt.is_file() and lh.is_file():
            x, h = np.load(lt), np.load(lh)
            rec["logits_rel_err"] = rel_err(x, h)
            if l32.is_file():
                h32 = np.load(l32)
                rec["logits_rel_err_f32"] = rel_err(x, h32)
                rec["peer_bf16_vs_f32_rel_err"] = rel_err(h, h32)
        if rec["tilec"] and rec["limit_tok_s"]:
            rec["tilec_of_limit"] = rec["tilec"] / rec["limit_tok_s"]
        lines.append(json.dumps(rec))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "llama-decode.jsonl", "a") as f:
        f.write("".join(line + "\n" for line in lines))
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    batches = lambda s: [int(x) for x in s.replace(",", " ").split()]  # noqa: E731
    pp = sub.add_parser("peer")
    pp.add_argument("work", type=Path)
    pp.add_argument("--batches", type=batches, default=[1, 16])
    pp.add_argument("--new", type=int, default=128)
    pp.add_argument("--device", default="cuda")
    pp.add_argument("--compile", action="store_true")
    pj = sub.add_parser("judge")
    pj.add_argument("work", type=Path)
    pj.add_argument("--batches", type=batches, default=[1, 16])
    pj.add_argument("--device", default="cuda")
    pr = sub.add_parser("report")
    pr.add_argument("work", type=Path)
    pr.add_argument("outdir", type=Path)
    pr.add_argument("--batches", type=batches, default=[1, 16])
    a = ap.parse_args()
    {"peer": peer, "judge": judge, "report": report}[a.cmd](a)


if __name__ == "__main__":
    main()
