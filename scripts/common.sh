# shellcheck shell=bash
# Sourced by scripts/quickstart and scripts/test: installs what is missing, then configures build/.
# Set CUDAARCHS (e.g. "80;90") to choose the CUDA architectures; otherwise those of the GPUs on
# this machine are used, or gear's default (90) where there is none.

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
scripts/install-deps
export PATH=/usr/local/cuda/bin:$PATH

build_dir=build

gear_configure() {
  local args=(-S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release)
  # Keep the generator of an existing build folder; choose Ninja for a new one.
  [[ -f $build_dir/CMakeCache.txt ]] || args+=(-G Ninja)
  if [[ -n ${CUDAARCHS:-} ]]; then
    args+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDAARCHS")
  elif command -v nvidia-smi >/dev/null 2>&1; then
    local archs
    archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
      tr -d '. ' | grep -E '^[0-9]+$' | sort -u | paste -sd ';' || true)
    [[ -z $archs ]] || args+=("-DCMAKE_CUDA_ARCHITECTURES=$archs")
  fi
  # No choice and no GPU: gear's default, also over a choice an earlier run left in build/.
  [[ " ${args[*]} " == *" -DCMAKE_CUDA_ARCHITECTURES="* ]] || args+=(-DCMAKE_CUDA_ARCHITECTURES=90)
  echo "gear: configuring $build_dir/"
  cmake "${args[@]}"
}
