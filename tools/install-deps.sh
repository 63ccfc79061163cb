#!/usr/bin/env bash
# Installs woq's build and test dependencies from Debian 12 (bookworm) packages.
set -euo pipefail
packages=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libsentencepiece-dev libpcre2-dev libutf8proc-dev libcli11-dev
          libfmt-dev libgtest-dev libbenchmark-dev libopenblas-dev libboost-dev python3-numpy python3-jinja2 python3-dev pybind11-dev python3-pytest
          clang-14 libclang-rt-14-dev)
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

# The Python module, its tests, the reference scripts of tests/reference and the README's examples all use
# the first python3 on PATH (CMake's choice too). Debian's gets NumPy, Jinja2 and pytest from the packages
# above; another one (pyenv, a venv) gets them from pip.
python=$(command -v python3)
if ! "$python" -c 'import numpy, jinja2, pytest' 2> /dev/null; then
  echo "install-deps: $python lacks NumPy, Jinja2 or pytest; installing them with pip" >&2
  "$python" -m pip install --quiet numpy jinja2 pytest ||
    echo "install-deps: pip could not install them into $python; the tests that need them will fail (or skip" \
         "outside CI). Offline, build for Debian's: cmake -S . -B build -DPython_EXECUTABLE=/usr/bin/python3" >&2
fi
