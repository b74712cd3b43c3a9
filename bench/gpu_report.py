"""Merges tilec's gpu_bench output and the peers' into bench/results/cuda-DATE.json and a
markdown table, and prints the table.
usage: python3 bench/gpu_report.py TILEC.jsonl PEERS.jsonl OUT.json OUT.md
       python3 bench/gpu_report.py --models MODELS.jsonl OUT.md   (whole models on the GPU)"""
import datetime
import json
import sys


def lines(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    except OSError:
        pass
    return out


def main():
    tl, pl, out_json, out_md = sys.argv[1:5]
    t, p = lines(tl), lines(pl)
    dev = next((x for x in t if "device" in x), {})
    copy = next((x for x in t if x.get("op") == "copy_dtod"), {})
    copy_bw = copy.get("tb_s")
    rows, variants = [], []
    for k in t:
        if "dtype" not in k or k.get("op") == "copy_dtod":
            continue
        if k.get("variant"):
            variants.append({
                "op": k["op"], "dtype": k["dtype"], "variant": k["variant"], "ok": k.get("ok"),
                "shape": [k.get("rows"), k.get("cols")],
                "tilec_tb_s": k.get("tb_s"), "regs": k.get("regs"), "blocks_per_sm": k.get("blocks_per_sm"),
                "grid": k.get("grid"), "block": k.get("block"),
                "vs_copy": (k["tb_s"] / copy_bw) if copy_bw and k.get("tb_s") else None,
            })
            continue
        same = lambda x: (x.get("op") == k["op"] and x.get("dtype") == k["dtype"]
                          and x.get("rows", k.get("rows")) == k.get("rows") and x.get("cols", k.get("cols")) == k.get("cols"))
        peers = {x["impl"]: x for x in p if same(x)}
        r = {
            "op": k["op"], "dtype": k["dtype"], "shape": [k.get("rows"), k.get("cols")],
            "tilec_ms": k.get("ms"), "tilec_tb_s": k.get("tb_s"), "ok": k.get("ok"),
            "max_rel_err": k.get("max_rel_err"),
            "vs_copy": (k["tb_s"] / copy_bw) if copy_bw and k.get("tb_s") else None,
            "eager_tb_s": peers.get("torch_eager", {}).get("tb_s"),
            "compile_tb_s": peers.get("torch_compile", {}).get("tb_s"),
            "regs": k.get("regs"), "blocks_per_sm": k.get("blocks_per_sm"),
            "grid": k.get("grid"), "block": k.get("block"),
        }
        rows.append(r)
    res = {
        "date": datetime.date.today().isoformat(),
        "machine": dev,
        "copy_tb_s": copy_bw,
        "torch_copy_tb_s": next((x.get("tb_s") for x in p if x.get("op") == "copy_dtod"), None),
        "peer": next((x for x in p if "peer" in x), {}),
        "kernels": rows,
        "schedule_variants": variants,
    }
    with open(out_json, "w") as f:
        json.dump(res, f, indent=2)
    f3 = lambda v: "—" if v is None else f"{v:.2f}"
    md = [f"# CUDA memory-bound kernels, {res['date']}", "",
          f"{dev.get('device', '?')} ({dev.get('sms', '?')} SMs), copy {f3(copy_bw)} TB/s measured in the same run "
          f"(torch copy {f3(res['torch_copy_tb_s'])}). TB/s counts the input read once and the output written once.", "",
          "| op | shape | dtype | ok | tilec TB/s | × copy | torch eager | torch.compile | tilec / compile |",
          "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    shape = lambda r: "×".join(str(v) for v in r["shape"])
    for r in rows:
        ratio = r["tilec_tb_s"] / r["compile_tb_s"] if r["tilec_tb_s"] and r["compile_tb_s"] else None
        md.append(f"| {r['op']} | {shape(r)} | {r['dtype']} | {r['ok']} | {f3(r['tilec_tb_s'])} | {f3(r['vs_copy'])} | "
                  f"{f3(r['eager_tb_s'])} | {f3(r['compile_tb_s'])} | {f3(ratio)} |")
    if variants:
        md += ["", "Schedule variants (the same kernels under other schedules; tuning data for the defaults):", "",
               "| op | dtype | schedule | ok | TB/s | × copy | regs | blocks/SM |",
               "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
        for d in rows:
            md.append(f"| {d['op']} | {d['dtype']} | default (grid {d['grid']}, block {d['block']}) | {d['ok']} | "
                      f"{f3(d['tilec_tb_s'])} | {f3(d['vs_copy'])} | {d['regs']} | {d['blocks_per_sm']} |")
            for v in variants:
                if v["op"] == d["op"] and v["dtype"] == d["dtype"] and v["shape"] == d["shape"]:
                    md.append(f"| {v['op']} | {v['dtype']} | {v['variant']} | {v['ok']} | {f3(v['tilec_tb_s'])} | "
                              f"{f3(v['vs_copy'])} | {v['regs']} | {v['blocks_per_sm']} |")
    text = "\n".join(md) + "\n"
    with open(out_md, "w") as f:
        f.write(text)
    print(text)


def models(path, out_md):
    rows = lines(path)
    f = lambda v, fmt: "—" if v is None else format(v, fmt)
    md = ["# Models end to end on the GPU (tilec run --target cuda)", "",
          "| model | check | ok | max abs err | max rel err | median ms | kernels | host nodes | graphs | compile ms | error |",
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        md.append(f"| {r['model']} | {r['check']} | {'ok' if r.get('ok') else 'FAIL'} | {f(r.get('max_abs_err'), '.2e')} | "
                  f"{f(r.get('max_rel_err'), '.2e')} | {f(r.get('median_ms'), '.3f')} | {f(r.get('kernels'), 'd')} | "
                  f"{f(r.get('host_nodes'), 'd')} | {f(r.get('graphs'), 'd')} | {f(r.get('compile_ms'), '.0f')} | "
                  f"{(r.get('error') or '').replace('|', '/')[:160]} |")
    ok = sum(1 for r in rows if r.get("ok"))
    md += ["", f"{ok} of {len(rows)} model checks pass."]
    text = "\n".join(md) + "\n"
    with open(out_md, "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--models":
        models(sys.argv[2], sys.argv[3])
    else:
        main()
