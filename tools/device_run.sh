#!/usr/bin/env bash
# One call on a lent GPU machine: real-GPU self-checks, the solution notebooks run at full size (NOTEBOOKS=02,03;
# needs the carry made with --notebooks), then the speed ladder of stages 01-04 (SKIP_BENCH=1 leaves it out).
# Run from the repo root there, with the carried folders .whl/ (numpy<2.5 and the pure-Python packages the
# machine lacks) and .gpudata/ (data_batch_1 and the Fashion-MNIST test set). Results land in $OUT.
# Prepare here:  python tools/prepare_device_carry.py   (downloads the wheels, copies the data subset)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD LABKIT_DATA=$PWD/.gpudata MPLBACKEND=Agg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import numpy, numba, platform
print("python", platform.python_version(), "numpy", numpy.__version__, "numba", numba.__version__)
import labkit.device as d; print(d.describe())
PY
STAGES=${STAGES:-01,02,03,04}; IMAGES=${IMAGES:-1200,50000}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  LABKIT_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_check.py tests/test_runner.py \
    tests/test_timing.py tests/test_profile.py 2>&1 | tail -5 | tee "$OUT/gpu_tests.txt"
fi
if [ -n "${NOTEBOOKS:-}" ]; then
  LABKIT_RESULTS="$OUT/notebooks/ledger.jsonl" python3 tools/execute_solutions.py --gpu --out "$OUT/notebooks" \
    ${NOTEBOOKS//,/ } 2>&1 | grep -v "without encryption" | tee "$OUT/notebooks.log"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 -m labkit bench --stages "$STAGES" --images "$IMAGES" --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench.log" | grep -v '^bench:'
fi
