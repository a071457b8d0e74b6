#!/usr/bin/env bash
# CPU prefill and decode of the bundled generator's shape in each form of scripts/build-llama-server.sh
# (native, amxfix, noamx, portable), weight repacking on and off; and whether each form serves at all.
#
#   bash bench/llama_cpu_kernels.sh MODEL.gguf OUT_DIR [FORMS]
#
# A FORMS entry LABEL=DIR measures the binaries in DIR/bin as they are (no build): bench/amx_relink.sh
# makes such folders.
# MODEL: the bundled Gemma 3 270M Q4_K_M, or a file of its shape (bench/README.md, "CPU kernels", says how
# one was made where the bundled file could not travel). FORMS default: "native amxfix noamx".
# Builds under RAG_CACHE_DIR (default /tmp/rag-cache: the pinned sdist must be in its src/); prints and
# writes OUT_DIR/llama_cpu_kernels.jsonl (llama-bench's JSON lines, each with "form" and "repack") and
# OUT_DIR/serves.txt (the test-run of each form, as the build script does it).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=$1 out=$2 forms=${3:-native amxfix noamx}
export RAG_CACHE_DIR=${RAG_CACHE_DIR:-/tmp/rag-cache} LLAMA_CHECK_MODEL=$model EXTRA_TARGETS=llama-bench
mkdir -p "$out"
scratch=$(mktemp -d)
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores"
  echo "amx: $(grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "kernel: $(uname -r); compiler: $(c++ --version | head -n 1)"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

build() {  # FORM JOBS: the build script's own output (it test-runs the binary) into OUT/build-FORM.txt
  LLAMA_CPU_FORM=$1 JOBS=$2 bash "$here/scripts/build-llama-server.sh" >"$out/build-$1.txt" 2>&1
  echo "build $1: exit $?" | tee -a "$out/serves.txt"
}
# The first build unpacks the source; the others then share it.
built=$(tr ' ' '\n' <<<"$forms" | grep -v = || true)
first=$(head -n 1 <<<"$built")
[ -n "$first" ] && build "$first" "$(nproc)"
for form in $(sed 1d <<<"$built"); do build "$form" "$(nproc)" & done
wait

for entry in $forms; do
  if [[ $entry == *=* ]]; then
    form=${entry%%=*} dir=${entry#*=}
  else
    form=$entry dir=$(LLAMA_CPU_FORM=$form bash "$here/scripts/build-llama-server.sh" --forms | cut -d' ' -f2)
  fi
  for repack in 1 0; do
    # LLAMA_ARG_REPACK=0 is llama-server's --no-repack: no extra buffer types (AMX, repacked weights).
    if LLAMA_ARG_REPACK=$repack bash "$here/scripts/build-llama-server.sh" --check "$dir/bin/llama-server" \
        >"$scratch/check.txt" 2>&1; then
      echo "serves $form repack=$repack: yes" | tee -a "$out/serves.txt"
    else
      echo "serves $form repack=$repack: no: $(head -n 1 "$scratch/check.txt")" | tee -a "$out/serves.txt"
      sed -n '2,$p' "$scratch/check.txt" >>"$out/serves.txt"
    fi
    for threads in "$(nproc)" 2; do
      if [ "$threads" = 2 ]; then sizes=(-p 512 -n 32 -r 3); else sizes=(-p 512,2048 -n 64 -r 5); fi
      "$dir/bin/llama-bench" -m "$model" -t "$threads" --repack "$repack" "${sizes[@]}" -o jsonl \
        2>"$scratch/bench-stderr.txt" |
        python3 "$here/bench/_llama_bench_rows.py" "$form" "$repack" >>"$out/llama_cpu_kernels.jsonl"
      code=${PIPESTATUS[0]}
      [ "$code" = 0 ] || echo "bench $form repack=$repack t=$threads: exit $code; $(tail -n 2 "$scratch/bench-stderr.txt")" |
        tee -a "$out/serves.txt"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
