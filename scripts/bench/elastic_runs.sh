#!/usr/bin/env bash
# The elastic demo's record: scripts/examples/elastic_demo.sh with GsSketch and with
# --compression none, each with a worker killed and a slot added (KILL_AT=60, ADD_AT=120) and
# uninterrupted (KILL_AT=0), seeds 0 and 1; every summary into one JSON file. GsSketch at a fixed
# --ratio 0.01 (the default when the record was taken), so that its residuals exist to be lost.
#   bash scripts/bench/elastic_runs.sh docs/elastic_demo.json
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:?usage: elastic_runs.sh OUT.json}"
[ ! -e "$out" ] || { echo "$out exists: remove it or choose another" >&2; exit 2; }
parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT
for seed in 0 1; do
  for compression in gs none; do
    for kill in 60 0; do
      name="$compression-seed$seed-$([ "$kill" = 0 ] && echo uninterrupted || echo killed_then_added)"
      KILL_AT=$kill ADD_AT=120 SUMMARY="$parts/$name.json" \
        bash "$ROOT/scripts/examples/elastic_demo.sh" --compression "$compression" --seed "$seed" \
          $([ "$compression" = gs ] && echo --ratio 0.01)
    done
  done
done
python - "$parts" "$out" <<'PY'
import json, pathlib, subprocess, sys
parts, out = pathlib.Path(sys.argv[1]), sys.argv[2]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
runs = {p.stem: json.loads(p.read_text()) for p in sorted(parts.glob("*.json"))}
pathlib.Path(out).write_text(json.dumps({"code": commit, "command": "bash scripts/bench/elastic_runs.sh " + out,
                                         "runs": runs}, indent=1) + "\n")
PY
