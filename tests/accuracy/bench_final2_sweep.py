#!/usr/bin/env python3
"""Every cell of the Ultra-Scale Playbook's benchmark runs as a held-out check (issues M12, M15).

tests/accuracy/published/ultrascale-playbook*.yaml hold 44 of the runs, chosen before any was simulated and gated by
tests/planner/test_published_runs.cpp. The runs' CSV (bench_final2, republished as eyao600/Rapid-LLM
validation_scripts/huggingface_data/bench_final2_mod_add.csv @ 24ef24c616888cf770f9a05b7b548026aa4f1a39) holds some
4,000 cells; its 1.34G and 3.57G models (the playbook's 1B and 3B) ran about 700 successful data-, tensor- and
pipeline-parallel cells. This script turns each of those into a row of the published-runs format, cloned from the
mesh block's dp1 tp4 pp2 row (the model, runtime, cluster and every knob the same but the mesh, micro-batch,
accumulation and ZeRO stage, and the measured tok/s/gpu, 'Mem Res (GB)' and 'Mem Alloc (GB)'), so that
`fsdp-plan validate OUT` prices all of them; `summarise` groups the errors by model, tensor and pipeline degree and
ZeRO stage. Nothing is fitted on these cells and nothing gates them: a change to the cost model is checked against
them before it is kept (README, "Accuracy on published runs").

  bench_final2_sweep.py make CSV OUT_DIR          # writes OUT_DIR/bench-final2-sweep.yaml (+ models/, SCHEMA.md)
  fsdp-plan validate OUT_DIR > validate.txt
  bench_final2_sweep.py summarise validate.txt
  bench_final2_sweep.py floor CSV                 # measured ms per decoder layer and micro-batch, pipeline cells

Pipeline cells are taken only where the CSV marks them after_pp_fix (as the mesh block's are); cells of fewer than 8
GPUs, and repeats of a mesh, micro-batch, accumulation and ZeRO stage, are left out.
"""
import collections
import csv
import os
import re
import shutil
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLISHED = os.path.join(ROOT, "tests", "accuracy", "published")
TEMPLATE_ID = "uspm-1b-h100-1n-dp1-tp4-pp2-mbs8-ga32-zero0"
MODELS = {"1.34G": "nanotron-1b-ultrascale", "3.57G": "nanotron-3b-ultrascale"}
GPUS_PER_NODE = 8


def template_row(text):
    start = text.index(f'  - id: "{TEMPLATE_ID}"')
    end = text.find("\n  - id:", start + 1)
    return text[start:end if end >= 0 else len(text)].rstrip("\n") + "\n"


def substitute(row, pattern, value):
    out, n = re.subn(pattern, value, row, count=1)
    if n != 1:
        sys.exit(f"bench_final2_sweep: the template row has no match for {pattern!r}")
    return out


def make(csv_path, out_dir):
    text = open(os.path.join(PUBLISHED, "ultrascale-playbook-mesh.yaml")).read()
    tmpl = template_row(text)
    header = text[: text.index("rows:")].replace('id: "ultrascale-playbook-mesh"', 'id: "bench-final2-sweep"')
    rows, seen = [], set()
    for x in csv.DictReader(open(csv_path)):
        model = MODELS.get(x["name"].split("_", 1)[0])
        if model is None or x["status"] != "Success" or not x["Mem Res (GB)"] or not x["tok/s/gpu"]:
            continue
        tp, pp, dp = int(x["tp"]), int(x["pp"]), int(x["dp"])
        if pp > 1 and x["after_pp_fix"] != "True":
            continue
        gpus = tp * pp * dp
        if gpus < GPUS_PER_NODE:
            continue
        mbs, ga, zero = int(x["mbs"]), int(float(x["batch_accum"])), x["zero_stage"]
        key = (model, tp, pp, dp, mbs, ga, zero)
        if key in seen:
            continue
        seen.add(key)
        rid = f"sweep-{model.split('-')[1]}-dp{dp}-tp{tp}-pp{pp}-mbs{mbs}-ga{ga}-zero{zero}-job{x['job_id']}"
        r = substitute(tmpl, r'id: "[^"]*"', f'id: "{rid}"')
        r = substitute(r, r'model: "[^"]*"', f'model: "{model}"')
        r = substitute(r, r"\n    nodes: \d+", f"\n    nodes: {gpus // GPUS_PER_NODE}")
        r = substitute(r, r'\n    strategy: "[^"]*"', '\n    strategy: "%s"' % ("ddp" if zero == "0" else "zero1"))
        r = substitute(r, r"\n    tp: \d+", f"\n    tp: {tp}")
        r = substitute(r, r"\n    sequence_parallel: \w+", "\n    sequence_parallel: %s" % str(tp > 1).lower())
        r = substitute(r, r"\n    pp: \d+", f"\n    pp: {pp}")
        if pp == 1:
            r = substitute(r, r"\n    pp_schedule: [^\n]*", "")
            r = substitute(r, r"\n      memory_of: [^\n]*", "")
        r = substitute(r, r"\n    micro_batch: \d+", f"\n    micro_batch: {mbs}")
        r = substitute(r, r"\n    grad_accum: \d+", f"\n    grad_accum: {ga}")
        r = substitute(r, r"tokens_per_s_per_gpu: [\d.]+", f"tokens_per_s_per_gpu: {x['tok/s/gpu']}")
        r = substitute(r, r"peak_memory_gib: [\d.]+", f"peak_memory_gib: {x['Mem Res (GB)']}")
        r = substitute(r, r"step_peak_allocated_gib: [\d.]+", f"step_peak_allocated_gib: {x['Mem Alloc (GB)']}")
        r = substitute(r, r'quote: "[^"]*"', f"quote: \"bench_final2 job {x['job_id']} '{x['name']}'\"")
        rows.append(r)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench-final2-sweep.yaml"), "w") as f:
        f.write(header + "rows:\n" + "".join(rows))
    models = os.path.join(out_dir, "models")
    if os.path.exists(models):
        shutil.rmtree(models)
    shutil.copytree(os.path.join(PUBLISHED, "models"), models)
    shutil.copy(os.path.join(PUBLISHED, "SCHEMA.md"), os.path.join(out_dir, "SCHEMA.md"))
    print(f"{len(rows)} rows in {out_dir}/bench-final2-sweep.yaml")


def summarise(validate_output):
    pattern = re.compile(r"^bench-final2-sweep\s+sweep-(\w+)-dp\d+-tp(\d+)-pp(\d+)-mbs\d+-ga\d+-zero(\d)\S*\s.*?"
                         r"(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")
    groups = collections.defaultdict(lambda: ([], []))

    def pct(s):
        return float(s.rstrip("%")) if s.endswith("%") else None

    for line in open(validate_output):
        m = pattern.match(line)
        if not m:
            continue
        model, tp, pp, zero = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        key = (model, "tp>1" if tp > 1 else "tp1", f"pp{pp}", f"zero{zero}")
        for i, err in ((0, m.group(7)), (1, m.group(10))):
            if pct(err) is not None:
                groups[key][i].append(pct(err))

    def line(v, band):
        if not v:
            return "-"
        a = [abs(x) for x in v]
        within = sum(1 for x in a if x <= band)
        return f"{len(v):4d} rows median |error| {statistics.median(a):5.1f}% mean {statistics.mean(v):+6.1f}% within {band:g}% {within:4d}"

    # The "peak allocated after the backward" block: `  bench-final2-sweep ROW PRED MEAS ERROR`.
    allocated = [pct(p[-1]) for p in (l.split() for l in open(validate_output))
                 if len(p) == 5 and p[0] == "bench-final2-sweep" and pct(p[-1]) is not None]
    every = ([x for g in groups.values() for x in g[0]], [x for g in groups.values() for x in g[1]])
    print(f"{'all cells':30s} time {line(every[0], 10)}\n{'':30s} mem  {line(every[1], 8)}")
    print(f"{'':30s} allocated after the backward {line(allocated, 3)}")
    for key in sorted(groups):
        name = " ".join(key)
        print(f"{name:30s} time {line(groups[key][0], 10)}\n{'':30s} mem  {line(groups[key][1], 8)}")


def stage_layers(x, pp):
    """Decoder layers per pipeline stage under nanotron's compute-cost split as the runs built it (the cumulative cost
    reaching the rank's threshold closes the stage; simulator/program/pipeline_parallel.cpp pipeline_split_by_cost)."""
    h, heads, ffn = int(x["hidden_size"]), int(x["num_heads"]), int(float(x["interm_dim"]))
    layer = 4 * heads * (h // heads) * h + 3 * ffn * h
    costs = [0] + [layer] * int(x["num_layers"]) + [0, int(float(x["vocab_size"])) * h, 0, 0]
    total, rank, cumulative, rank_of = sum(costs), 0, 0, []
    for c in costs:
        rank_of.append(rank)
        cumulative += c
        if rank + 1 < pp and cumulative >= total * ((rank + 1) / pp):
            rank += 1
    layers = rank_of[1:1 + int(x["num_layers"])]
    return [layers.count(s) for s in range(pp)]


def floor(csv_path):
    """The measured time per micro-batch over the most decoder layers a stage holds, for every successful pipeline cell
    (after_pp_fix, >= 8 GPUs), grouped by whether a stage boundary crosses a node (nanotron's rank layout: pp outermost,
    then dp, then tp, src/nanotron/parallel/context.py), the tensor-parallel degree and the micro-batch. Where the
    pipeline crosses nodes and tp > 1, the small micro-batches sit on a floor that depends on tp alone (README,
    "Accuracy on published runs")."""
    groups = collections.defaultdict(list)
    for x in csv.DictReader(open(csv_path)):
        if MODELS.get(x["name"].split("_", 1)[0]) is None or x["status"] != "Success" or not x["tok/s/gpu"]:
            continue
        tp, pp, dp = int(float(x["tp"])), int(float(x["pp"])), int(float(x["dp"]))
        if pp < 2 or x["after_pp_fix"] != "True" or tp * pp * dp < GPUS_PER_NODE:
            continue
        mbs = int(float(x["mbs"]))
        seconds_per_micro_batch = mbs * int(x["seq_len"]) / (float(x["tok/s/gpu"]) * tp * pp)
        per_stage = tp * dp
        crosses = any(r // GPUS_PER_NODE != (r + per_stage) // GPUS_PER_NODE for r in range((pp - 1) * per_stage))
        key = ("crosses nodes" if crosses else "within a node", tp, "mbs<=4" if mbs <= 4 else "mbs>4")
        groups[key].append(1e3 * seconds_per_micro_batch / max(stage_layers(x, pp)))
    for key in sorted(groups):
        v = sorted(groups[key])
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
        print(f"{key[0]:14s} tp {key[1]:2d} {key[2]:7s} {len(v):4d} cells  ms per layer and micro-batch: "
              f"median {statistics.median(v):6.1f}  quartiles {q[0]:6.1f} {q[2]:6.1f}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "summarise":
        summarise(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "floor":
        floor(sys.argv[2])
    else:
        sys.exit(__doc__)
