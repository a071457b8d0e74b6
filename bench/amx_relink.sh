#!/usr/bin/env bash
# Relink a native build (scripts/build-llama-server.sh's build folder) with another object file for
# llama.cpp's AMX kernels (ggml-cpu/amx/mmq.cpp), compiled elsewhere: how bench/README.md ("CPU kernels")
# measured GCC 12's AMX code on a machine whose own compiler is newer.
#
#   bash bench/amx_relink.sh BUILD_DIR MMQ.o OUT_DIR     -> OUT_DIR/bin/llama-server, OUT_DIR/bin/llama-bench
set -euo pipefail
build=$1 object=$(realpath "$2") out=$3
cd "$build"
cp "$object" ggml/src/CMakeFiles/ggml-cpu.dir/ggml-cpu/amx/mmq.cpp.o
# The archive of the CPU backend, then each program's link: the commands ninja would run.
ninja -t commands bin/llama-server | grep -E ' ggml/src/libggml-cpu\.a |-o bin/llama-server ' | sh -e
ninja -t commands bin/llama-bench | grep -E -- '-o bin/llama-bench ' | sh -e
mkdir -p "$out/bin"
cp bin/llama-server bin/llama-bench "$out/bin/"
