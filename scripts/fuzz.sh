#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-19 (ASan + UBSan) and runs each for a while from its
# committed seed corpus (tests/fuzz/corpus/<target>). A crash fails the script; the reproducer
# is left in build-libfuzzer/crashes/ (turn it into a regression test).
#   ROPEKV_FUZZ_SECONDS   seconds per target (default 40; longer campaigns: set it)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
seconds="${ROPEKV_FUZZ_SECONDS:-40}"
install_missing fuzz clang-19 libclang-rt-19-dev libomp-19-dev
dir=build-libfuzzer
mkdir -p $dir
if [ ! -f $dir/CMakeCache.txt ]; then
  cmake -S . -B $dir -DCMAKE_BUILD_TYPE=RelWithDebInfo -DROPEKV_FUZZ=ON \
    -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_C_COMPILER=clang-19 >$dir/configure.log 2>&1 ||
    { cat $dir/configure.log; exit 1; }
fi
cmake --build $dir -j "$(nproc)" --target fuzz_repro fuzz_golden fuzz_validate >$dir/build.log 2>&1 ||
  { tail -n 60 $dir/build.log; exit 1; }
mkdir -p $dir/crashes
status=0
for t in fuzz_repro fuzz_golden fuzz_validate; do
  work=$dir/corpus/$t
  mkdir -p "$work"
  # Findings go to a scratch corpus; the committed seeds are read only.
  if ./$dir/$t "$work" tests/fuzz/corpus/$t -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
       -artifact_prefix=$dir/crashes/$t- -print_final_stats=0 >$dir/$t.log 2>&1; then
    echo "fuzz: $t ok ($(grep -o 'Done [0-9]* runs' $dir/$t.log | grep -o '[0-9]*') runs in ${seconds}s)"
  else
    echo "fuzz: $t FAILED; log: $dir/$t.log"; tail -n 30 $dir/$t.log; status=1
  fi
done
exit $status
