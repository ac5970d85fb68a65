#!/usr/bin/env bash
# Refreshes tests/python/requirements.txt, the one lock file of every PyPI package ropekv installs:
# a scratch venv installs the names in tests/python/requirements.in at their newest versions, and
# `pip freeze` of that venv (every dependency, exact `==` pins) becomes the lock. Review the diff,
# run `bash scripts/test.sh`, commit both files together.
set -euo pipefail
cd "$(dirname "$0")/.."
src=tests/python/requirements.in
lock=tests/python/requirements.txt
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install -q --disable-pip-version-check -r "$src"
{
  echo "# The lock: every PyPI package ropekv's tests install, pinned exactly (pip freeze of a fresh"
  echo "# venv made from requirements.in). Do not edit by hand: bash scripts/lock_python.sh"
  echo "# Python $("$scratch/venv/bin/python" -c 'import platform; print(platform.python_version())')"
  # --all: setuptools too (torch needs a newer one than a venv starts with); pip itself is the
  # interpreter's own and stays unpinned.
  "$scratch/venv/bin/python" -m pip freeze --all --disable-pip-version-check | grep -v '^pip==' | LC_ALL=C sort -f
} >"$lock.tmp"
mv "$lock.tmp" "$lock"
echo "lock_python: wrote $lock ($(grep -c '==' "$lock") pins)"
