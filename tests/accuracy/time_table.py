#!/usr/bin/env python3
# The step-time check's table (run_time_grid.sh): predicted (fsdp-plan --json, pass 1) against measured (median
# of steps 2..N of every pass's fsdp-run report) for every row of OUT_DIR/pass1/rows.tsv. Exit 1 when a judged
# row is off by more than its tolerance. Rerun it on a finished OUT_DIR to re-read a run:
#   time_table.py OUT_DIR TOLERANCE_PERCENT BF16_TOLERANCE_PERCENT SECONDS PASSES
import json, statistics, sys
out, tol_all, tol_bf16, secs, passes = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
rows = [l.rstrip("\n").split("\t") for l in open(out + "/pass1/rows.tsv")]
print("%-3s %-13s %5s %-6s %-9s %-5s %5s %-9s %6s | %9s %9s %7s | %s" % ("#", "strategy", "world", "wrap", "ckpt",
      "dtype", "accum", "offload", "mbxseq", "pred ms", "meas ms", "error", "measured steps 2.. of each pass (ms)"))
worst, failed, unstable, errs = 0.0, 0, 0, {}
for r in rows:
    i = r[0]
    pred = json.load(open(f"{out}/pass1/pred{i}.json"))["chosen"]["time"]["step_s"]
    # Step 1 of every run warms up (allocations, first collectives); the rest of every pass count alike.
    per_pass = [[s["time_s"] for s in json.load(open(f"{out}/pass{p}/report{i}.json"))["steps"]][1:]
                for p in range(1, passes + 1)]
    steps = [t for run in per_pass for t in run]
    meas = statistics.median(steps)
    # A plan whose passes disagree with each other by more than the tolerance was measured in different
    # states of the machine (slow phases of minutes on a shared VM): it is shown, but not judged.
    pass_medians = [statistics.median(run) for run in per_pass]
    spread = (max(pass_medians) / min(pass_medians) - 1) * 100
    err = (pred - meas) / meas * 100
    worst = max(worst, abs(err))
    errs[i] = err
    tol = tol_bf16 if r[5] == "bf16" else tol_all
    shaky = passes > 1 and spread > tol
    bad = abs(err) > tol and not shaky
    failed += bad
    unstable += shaky
    print("%-3s %-13s %5s %-6s %-9s %-5s %5s %-9s %6s | %9.1f %9.1f %+6.1f%% | %s%s" % (i, r[1], r[2], r[3], r[4],
          r[5], r[6], r[7], r[9] + "x" + r[10], pred * 1e3, meas * 1e3, err,
          " ".join("%.0f" % (t * 1e3) for t in steps),
          "  <-- over %.0f%%" % tol if bad else
          "  (not judged: pass medians %s ms differ by %.0f%%)" % ("/".join("%.0f" % (m * 1e3) for m in pass_medians),
                                                                  spread) if shaky else ""))
within15 = sum(1 for r in rows if abs(errs[r[0]]) <= 15)
gate = "%.0f%%" % tol_all if tol_bf16 == tol_all else "%.0f%% (fp32), %.0f%% (bf16)" % (tol_all, tol_bf16)
print("%d plans x %d passes in %s s, worst |error| %.1f%%, %d within 15%%, %d over the tolerance %s" % (len(rows),
      passes, secs, worst, within15, failed, gate))
print("%d passed, %d failed, %d not judged (their passes differ by more than the tolerance)" % (
      len(rows) - failed - unstable, failed, unstable))
sys.exit(1 if failed else 0)
