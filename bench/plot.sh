#!/usr/bin/env bash
# Turns gear_bench's JSON (--benchmark_out) into PNG plots: sample+gather throughput against step
# size, one line per batch size, for gear, the naive gather kernel and the CPU pipeline, with the
# limit measured in the same run drawn as a line; sample+gather against window length; and the
# time of one sample call against capacity N, per selection policy. Needs jq and gnuplot (Debian:
# jq, gnuplot-nox).
#
#   bench/plot.sh bench/results/h200.json bench/results
#
# writes <outdir>/sample_device.png and <outdir>/sample_pinned_host.png, and where the JSON holds
# their benchmarks <outdir>/sample_window.png and <outdir>/select_cost.png.
set -euo pipefail

json=${1:?usage: plot.sh results.json [outdir]}
outdir=${2:-.}
mkdir -p "$outdir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Writes one PNG: render <png> <title> <xlabel> <ylabel> <more gnuplot settings> <plot list>.
render() {
  gnuplot <<EOF
set terminal pngcairo size 900,560 noenhanced
set output '$1'
set title '$2'
set xlabel '$3'
set ylabel '$4'
set offsets graph 0.03, graph 0.03, 0, 0
set grid
$5
plot $6
EOF
  echo "wrote $1"
}

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
  render "$outdir/sample_$storage.png" "gear sample + gather, $storage storage, windows of 64 steps" \
    "step size" "$ylabel" \
    "set logscale x 2
set xtics ('256 B' 256, '1 KiB' 1024, '4 KiB' 4096, '28 KiB' 28672, '1 MiB' 1048576)
set yrange [0:${limit:+$limit * 1.1}]
set key bottom right" "$joined"
done

# Window-length axis: percent of the in-run limit, one line per storage.
# storage window batch step GBps ratio
jq -r '.benchmarks[]
  | select(.GBps != null and (.error_occurred | not))
  | (.name | capture("^sample/(?<storage>[a-z_]+)/step:(?<step>[0-9]+)/window:(?<window>[0-9]+)/batch:(?<batch>[0-9]+)")) as $n
  | [$n.storage, $n.window, $n.batch, $n.step, .GBps, (.ratio // 0)] | @tsv' "$json" \
  >"$tmp/window.tsv" || true
if [[ -s $tmp/window.tsv ]]; then
  plots=()
  for storage in device pinned_host; do
    f="$tmp/window.$storage.tsv"
    awk -F'\t' -v s="$storage" '$1 == s' "$tmp/window.tsv" | sort -t$'\t' -k2,2n >"$f"
    [[ -s $f ]] || continue
    step=$(head -n1 "$f" | cut -f4)
    batch=$(head -n1 "$f" | cut -f3)
    if [[ $storage == device ]]; then what="D2D cudaMemcpy"; else what="pinned H2D cudaMemcpy"; fi
    plots+=("'$f' using 2:(100 * \$6) with linespoints title '$storage, $step B steps, B = $batch (vs $what)'")
  done
  if ((${#plots[@]})); then
    joined=$(IFS=,; echo "${plots[*]}")
    render "$outdir/sample_window.png" "gear sample + gather against window length" \
      "window length (steps)" "percent of the copy limit measured in the same run" \
      "set logscale x 2
set yrange [0:110]
set key bottom right" "$joined"
  fi
fi

# Selection cost against capacity: microseconds per sample call, one line per policy.
# policy N batch us_per_sample us_per_row
jq -r '.benchmarks[]
  | select(.us_per_sample != null and (.error_occurred | not))
  | (.name | capture("^select/[a-z_]+/(?<policy>[a-z_]+)/N:(?<n>[0-9]+)/batch:(?<batch>[0-9]+)")) as $n
  | [$n.policy, $n.n, $n.batch, .us_per_sample, (.us_per_row // 0)] | @tsv' "$json" \
  >"$tmp/select.tsv" || true
if [[ -s $tmp/select.tsv ]]; then
  plots=()
  for policy in $(cut -f1 "$tmp/select.tsv" | sort -u); do
    f="$tmp/select.$policy.tsv"
    awk -F'\t' -v p="$policy" '$1 == p' "$tmp/select.tsv" | sort -t$'\t' -k2,2n >"$f"
    plots+=("'$f' using 2:4 with linespoints title '$policy, B = $(head -n1 "$f" | cut -f3)'")
  done
  joined=$(IFS=,; echo "${plots[*]}")
  render "$outdir/select_cost.png" "gear sample_async (selection + gather of 8 B per row), device storage, every slot filled" \
    "capacity N (trajectories)" "microseconds per sample call (GPU time)" \
    "set logscale x 2
set format x '2^%L'
set yrange [0:*]
set key top left" "$joined"
fi
