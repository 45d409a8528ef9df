#!/usr/bin/env bash
# The CPU benchmarks that docs/performance-cpu.md quotes, each printout kept as eval/cpu/<benchmark>.txt with the
# machine it ran on and the processes running when it started (ratios measured side by side survive some load; a quiet
# machine is better: nothing else running, "1/..." below).
#   bash eval/cpu/make_cpu_bench.sh [BENCHMARK ...]     (default: models train diagnostics eval intervene data)
#   ARGS='repeats=15' bash eval/cpu/make_cpu_bench.sh diagnostics      (ARGS: added to every benchmark's command)
set -euo pipefail
cd "$(dirname "$0")/../.."
read -ra WHICH <<<"${*:-models train diagnostics eval intervene data}"
rc=0
for b in "${WHICH[@]}"; do
  out=eval/cpu/$b.txt
  if {
    echo "# python -m vitsinks.bench $b ${ARGS:-}"
    echo "# $(date -u +%F) | $(nproc) cores | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
         "| running/processes at start $(cut -d' ' -f4 /proc/loadavg)" \
         "| torch $(python -c 'import torch; print(torch.__version__)')"
    TQDM_DISABLE=1 python -m vitsinks.bench "$b" ${ARGS:-}
  } > "$out.tmp"; then
    mv "$out.tmp" "$out" && echo "written: $out"
  else  # the earlier printout stays
    rm -f "$out.tmp"; echo "$b: the benchmark failed (its message above); $out left as it was" >&2; rc=1
  fi
done
exit $rc
