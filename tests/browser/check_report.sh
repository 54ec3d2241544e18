#!/usr/bin/env bash
# Browser test of the HTML report (issue 9): writes reports with the real fsdp-plan, opens each in
# headless Chromium and checks that the charts render with no console error (check_report.py), and keeps
# a full-page screenshot of each (plus one per section) as artefacts.
#
# usage: tests/browser/check_report.sh path/to/fsdp-plan [ARTEFACT_DIR]
#   ARTEFACT_DIR defaults to ./browser-report (ctest runs it in the build tree).
#   CHROMIUM=/path/to/chromium overrides the browser (default: /usr/bin/chromium, else chromium on PATH).
# exit 0: passed; 1: a check failed; 77: skipped because Chromium is not installed (ctest SKIP_RETURN_CODE).
# Installs nothing. On Debian: apt-get install -y --no-install-recommends chromium python3
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
plan_bin="${1:?usage: check_report.sh path/to/fsdp-plan [ARTEFACT_DIR]}"
out="${2:-$PWD/browser-report}"

chromium="${CHROMIUM:-}"
if [[ -z "$chromium" ]]; then
  if [[ -x /usr/bin/chromium ]]; then
    chromium=/usr/bin/chromium
  else
    chromium="$(command -v chromium || command -v chromium-browser || true)"
  fi
fi
if [[ -n "${CHROMIUM:-}" && ! -x "$CHROMIUM" ]]; then
  echo "FAIL browser_report: CHROMIUM=$CHROMIUM is not an executable" >&2
  exit 1
fi
if [[ -z "$chromium" || ! -x "$chromium" ]]; then
  echo "SKIP browser_report: Chromium is not installed, so the HTML report was not checked in a browser" \
       "(Debian: apt-get install -y --no-install-recommends chromium)"
  exit 77
fi
if ! command -v python3 >/dev/null; then
  echo "FAIL browser_report: python3 is needed to drive Chromium (Debian: apt-get install -y python3)" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. The headline command, and the plan it writes drawn back by `show`.
"$plan_bin" --model 70b --nodes 8 --out "$work/plan.yaml" --html "$out/report.html" >"$out/report.txt"
"$plan_bin" show "$work/plan.yaml" --html "$out/show.html" >/dev/null
# 2. No plan fits (exit 1 by design): the families' smallest plans are still drawn.
set +e
"$plan_bin" --model 70b --nodes 1 --strategy ddp --offload none --no-out --html "$out/nofit.html" >/dev/null
rc=$?
set -e
if [[ $rc -ne 1 ]]; then
  echo "FAIL browser_report: the no-fit search exited $rc, expected 1" >&2
  exit 1
fi
# 3. A model whose name is markup: escaped, it renders as text; unescaped, the script or the image would
#    run or be blocked by the page's Content-Security-Policy, and either shows up as a console error.
python3 - "$here/../data/hf/llama2-7b.json" "$work/hostile.json" <<'EOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["_name_or_path"] = "<script>console.error('not escaped')</script><img src=x onerror=\"console.error('x')\">&amp;"
json.dump(cfg, open(sys.argv[2], "w"))
EOF
"$plan_bin" --model "$work/hostile.json" --nodes 1 --no-out --html "$out/escaping.html" >/dev/null

python3 "$here/check_report.py" --chromium "$chromium" --out "$out" \
  "$out/report.html:memory-chart,timeline-chart,scatter-chart" \
  "$out/show.html:memory-chart,timeline-chart" \
  "$out/nofit.html:memory-chart,scatter-chart" \
  "$out/escaping.html:memory-chart,timeline-chart,scatter-chart"
echo "browser_report: screenshots in $out"
