#!/usr/bin/env bash
# Prints the path of a Python >= 3.12 (what inference-perf needs), or says why not and
# exits 2. With an argument, checks that one only (make's IPERF_PYTHON); without, tries
# python3.12, python3.13, python3.14 and python3 on PATH, then pyenv's installed versions
# (oldest first: 3.12 is the version inference-perf was tried with here).
ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }
if [ -n "$1" ]; then
    if ok "$1"; then command -v "$1"; exit 0; fi
    echo "IPERF_PYTHON=$1 is not a Python >= 3.12 (inference-perf needs one)" >&2
    exit 2
fi
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
for candidate in python3.12 python3.13 python3.14 python3 \
    $(ls -d "$pyenv_root"/versions/3.*/bin/python3 2>/dev/null | sort -V); do
    if ok "$candidate"; then command -v "$candidate"; exit 0; fi
done
echo "no Python >= 3.12 found (inference-perf needs one): install one and run" \
    "make bench-inference-perf IPERF_PYTHON=/path/to/python3.12" >&2
exit 2
