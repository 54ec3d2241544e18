#!/usr/bin/env bash
# Accuracy gate (issue M6): every plan of tests/accuracy/grid.txt runs through fsdp-run on CPU, and its
# measured peak allocated memory (max over ranks) is compared with fsdp-plan's prediction for the same
# plan (runtime fsdp-run, hardware cpu). Prints the table; fails when any |error| exceeds the tolerance. Where the
# prediction is a range (a Gloo gather's flat buffer may or may not overlap the compute peak: peak_bytes_floor up
# to peak_bytes, simulator/memory/memory_walk.hpp) the error is the measured peak's distance from that range. A row's
# gate (grid.txt's 14th field): all (the default), memory (its collectives are listed, not gated) or none (reported
# only); tests/accuracy/README.md says why each row that is not gated whole is not.
#   run_grid.sh FSDP_PLAN FSDP_RUN [TOLERANCE_PERCENT] [OUT_DIR]
set -euo pipefail
plan_bin=$1 run_bin=$2 tol=${3:-3} out=${4:-$(mktemp -d)}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
model=$root/tests/data/models/acc-small.yaml
mkdir -p "$out"
# shellcheck source=grid_rows.sh
source "$root/tests/accuracy/grid_rows.sh"
run_grid_rows cpu 2 || exit 1
# The step program beside each run's recorded step, collective by collective (issue M10): `fsdp-plan compare`.
while IFS=$'\t' read -r i _; do
  "$plan_bin" compare "$out/plan$i.yaml" "$out/report$i.json" --json >"$out/cmp$i.json" 2>"$out/cmp$i.err" ||
    { echo "row $i: fsdp-plan compare failed: $(cat "$out/cmp$i.err")"; exit 1; }
done <"$out/rows.tsv"
python3 - "$out" "$tol" <<'PY'
import json, sys
out, tol = sys.argv[1], float(sys.argv[2])
rows = [l.rstrip("\n").split("\t") for l in open(out + "/rows.tsv")]
print("%-3s %-10s %-13s %-11s %5s %-6s %-9s %-5s %5s %-9s %6s | %10s %10s %10s %7s" % ("#", "model", "strategy",
      "mesh", "world", "wrap", "ckpt", "dtype", "accum", "offload", "mb*seq", "floor MiB", "pred MiB", "meas MiB",
      "error") +
      " | %-40s %-40s" % ("predicted peak phase", "measured peak phase"))
worst, failed = 0.0, 0
for r in rows:
    i = r[0]
    pm = json.load(open(f"{out}/pred{i}.json"))["chosen"]["memory"]
    mm = json.load(open(f"{out}/report{i}.json"))["memory"]
    pred, floor, meas = pm["peak_bytes"], pm["peak_bytes_floor"], mm["peak_bytes"]
    err = (min(max(meas, floor), pred) - meas) / meas * 100
    gated = r[14] in ("all", "memory")
    if gated:
        worst = max(worst, abs(err))
    bad = abs(err) > tol and gated
    failed += bad
    print("%-3s %-10s %-13s %-11s %5s %-6s %-9s %-5s %5s %-9s %6s | %10s %10.3f %10.3f %+6.1f%% | %-40s %-40s%s" % (i,
          r[12], r[1], r[13], r[2], r[3], r[4], r[5], r[6], r[7], r[9] + "x" + r[10], "%.3f" % (floor / 2**20) if floor < pred else "-",
          pred / 2**20, meas / 2**20, err, pm.get("peak_phase", ""), mm.get("peak_phase", ""),
          "  <-- over %.0f%%" % tol if bad else ("" if gated else "  (not gated)")))
# Per category, as `fsdp-plan compare` pairs them: the executor's tagged buffers by name, and the untagged rest
# (activations during forward/backward, transient elsewhere) against predicted activations + transient.
cats = {}
for r in rows:
    i = r[0]
    pb = json.load(open(f"{out}/pred{i}.json"))["chosen"]["memory"]["breakdown"]
    mb = json.load(open(f"{out}/report{i}.json"))["memory"]["breakdown"]
    pairs = {k: (pb.get(k, 0.0), mb[k]) for k in mb if k not in ("activations", "transient")}
    pairs["activations + transient"] = (pb.get("activations", 0.0) + pb.get("transient", 0.0),
                                        mb.get("activations", 0) + mb.get("transient", 0))
    peak = json.load(open(f"{out}/report{i}.json"))["memory"]["peak_bytes"]
    for k, (p, m) in pairs.items():
        if m > 0:  # error as a share of the measured peak: a category's miss is what it costs the total
            cats.setdefault(k, []).append((p - m) / peak * 100)
print("per category at the peak (rows where the run measured it; error in % of the measured peak):")
print("  %-24s %4s %12s %12s" % ("category", "rows", "mean |error|", "worst error"))
for k, errs in sorted(cats.items()):
    w = max(errs, key=abs)
    print("  %-24s %4d %11.1f%% %+11.1f%%" % (k, len(errs), sum(abs(e) for e in errs) / len(errs), w))
# Collectives and unit ops: every plan's run must do exactly what its step program says.
coll_failed = 0
for r in rows:
    c = json.load(open(f"{out}/cmp{r[0]}.json"))["collectives"]
    bad = (not c.get("measured")) or c["mismatches"] or c["unit_ops"]["mismatches"]
    if bad:
        gated = r[14] == "all"
        coll_failed += gated
        print("row %s: step program vs run: %s collective and %s unit-op mismatches%s" % (r[0], c.get("mismatches"),
              c.get("unit_ops", {}).get("mismatches"), "" if gated else " (not gated)"))
        for k in ("predicted_only", "measured_only"):
            for e in c.get(k, []) + c.get("unit_ops", {}).get(k, []):
                print("    %s: %s" % (k, e))
coll_gated = sum(r[14] == "all" for r in rows)
print("collectives: %d of %d gated plans match their step program entry by entry" % (coll_gated - coll_failed,
      coll_gated))
failed += coll_failed
print("%d plans, worst |error| %.1f%%, %d over the %.0f%% tolerance" % (len(rows), worst, failed - coll_failed, tol))
print("%d passed, %d failed" % (len(rows) - failed, failed))
sys.exit(1 if failed else 0)
PY
