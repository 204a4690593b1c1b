#!/usr/bin/env bash
# Turns gear_bench's JSON (--benchmark_out) into PNG plots: sample+gather throughput against step
# size, one line per batch size, for gear, the naive gather kernel and the CPU pipeline, with the
# limit measured in the same run drawn as a line. Needs jq and gnuplot (Debian: jq, gnuplot-nox).
#
#   bench/plot.sh bench/results/h200.json bench/results
#
# writes <outdir>/sample_device.png and <outdir>/sample_pinned_host.png.
set -euo pipefail

json=${1:?usage: plot.sh results.json [outdir]}
outdir=${2:-.}
mkdir -p "$outdir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# op storage step batch GBps limit_GBps, one line per benchmark that reported a figure.
jq -r '.benchmarks[]
  | select(.GBps != null and (.error_occurred | not))
  | (.name | capture("^(?<op>[a-z_]+)/(?<storage>[a-z_]+)/step:(?<step>[0-9]+)/batch:(?<batch>[0-9]+)")) as $n
  | [$n.op, $n.storage, $n.step, $n.batch, .GBps, (.limit_GBps // 0)] | @tsv' "$json" \
  >"$tmp/all.tsv" || true

for storage in device pinned_host; do
  grep -P "^[a-z_]+\t${storage}\t" "$tmp/all.tsv" >"$tmp/$storage.tsv" || continue
  [[ -s $tmp/$storage.tsv ]] || continue
  plots=()
  for op in sample naive_gather cpu_pipeline; do
    for batch in $(cut -f4 "$tmp/$storage.tsv" | sort -nu); do
      f="$tmp/$storage.$op.$batch.tsv"
      awk -F'\t' -v op="$op" -v b="$batch" '$1 == op && $4 == b' "$tmp/$storage.tsv" | sort -t$'\t' -k3,3n >"$f"
      [[ -s $f ]] || continue
      label=$op
      [[ $op == sample ]] && label=gear
      plots+=("'$f' using 3:5 with linespoints title '$label, B = $batch'")
    done
  done
  limit=$(awk -F'\t' '$1 == "sample" { s += $6; n++ } END { if (n) printf "%.1f", s / n }' "$tmp/$storage.tsv")
  if [[ $storage == device ]]; then
    what="D2D cudaMemcpy (read + write)"; ylabel="GB/s (bytes read + written)"
  else
    what="pinned H2D cudaMemcpy"; ylabel="GB/s (bytes gathered)"
  fi
  [[ -n $limit ]] && plots+=("$limit with lines dashtype 2 linewidth 2 title '$what: $limit GB/s'")
  joined=$(IFS=,; echo "${plots[*]}")
  gnuplot <<EOF
set terminal pngcairo size 900,560 noenhanced
set output '$outdir/sample_$storage.png'
set title 'gear sample + gather, $storage storage, windows of 64 steps'
set xlabel 'step size (bytes)'
set ylabel '$ylabel'
set logscale x 2
set yrange [0:${limit:+$limit * 1.1}]
set offsets graph 0.03, graph 0.03, 0, 0
set key bottom right
set grid
plot $joined
EOF
  echo "wrote $outdir/sample_$storage.png"
done
