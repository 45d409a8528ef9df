#!/usr/bin/env bash
# Write every committed leaderboard again with today's code, from the inputs committed beside it
# (<leaderboard>/inputs/: each run's config, metrics, results and the diagnostics summary it was tabulated from, and
# the title), and its findings.md where it has one (eval/residual/findings.py): nothing is trained, diagnosed or
# probed, about 10 s a leaderboard. tests/test_committed.py (and tests/test_findings_script.py) fail while a
# committed leaderboard (a findings page) differs from what this writes.
#   bash eval/regenerate.sh                  # in place; then commit what changed
#   OUT=/tmp/lb bash eval/regenerate.sh      # into /tmp/lb/eval/... instead
# A leaderboard without inputs (made before leaderboards kept them) is named and the script fails at the end: its
# make script writes them (python -m vitsinks.leaderboard always does).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-.}
missing=0
for md in $(find eval -name leaderboard.md -not -path '*/inputs/*' | sort); do
  board=$(dirname "$md")
  if [ ! -f "$board/inputs/leaderboard.json" ]; then
    echo "$board: no inputs/ to write it from; rerun its make script" >&2
    missing=1
    continue
  fi
  python -m vitsinks.leaderboard runs="$board/inputs" out="$OUT/$board" > /dev/null
  # a board's per-run findings page, where it has one, from the tables just written
  if [ -f "$board/findings.md" ]; then python eval/residual/findings.py "$board" "$OUT/$board" > /dev/null; fi
  echo "written: $OUT/$board"
done
exit "$missing"
