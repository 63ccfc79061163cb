#!/usr/bin/env bash
# Installs woq's build and test dependencies from Debian 12 (bookworm) packages.
set -euo pipefail
packages=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libsentencepiece-dev libpcre2-dev libutf8proc-dev libcli11-dev
          libfmt-dev libgtest-dev libbenchmark-dev libopenblas-dev libboost-dev python3-numpy python3-jinja2 python3-dev pybind11-dev python3-pytest
          clang-14 libclang-rt-14-dev gnuplot-nox
          nginx-light libopenmpi-dev openmpi-bin)
# Node.js and npm run the OpenAI client tests of woq serve; a node from elsewhere (e.g. NodeSource) is kept.
command -v node > /dev/null || packages+=(nodejs)
command -v npm > /dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python module, its tests and the tests' reference scripts use the first python3 on PATH that has NumPy,
# Jinja2 and pytest, else Debian's /usr/bin/python3, which the packages above give them (CMake's choice; it
# prints it). A pyenv or venv python3 without them is passed over, not changed.
if ! /usr/bin/python3 -c 'import numpy, jinja2, pytest' 2> /dev/null; then
  echo "install-deps: /usr/bin/python3 still lacks NumPy, Jinja2 or pytest after apt-get" >&2
  exit 1
fi
