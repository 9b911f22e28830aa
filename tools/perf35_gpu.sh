#!/usr/bin/env bash
# Issue 35's measurements in one call on an H100 (about 6 minutes; every step has a time limit and the whole run
# stops starting steps past BUDGET seconds, 450 by default): from the repository root,
#   OUT=DIR LABKIT_DATA=<folder with cifar-10-batches-bin/, fashion-mnist/, ece408-model/> bash tools/perf35_gpu.sh
# Steps (each one's output in WORK/<step>.txt, its exit code and seconds in WORK/steps.txt):
#   env      device, driver, versions, `labkit data where` (what the real data is);
#   rates    tools/mma_rates.py --save: mma.sync fp16 / TF32 and FMA multiply-add rates and the copy bandwidth,
#            kept as this device's in results/unit_rates.json (copied to WORK/unit_rates.json: commit it);
#   floor    tools/floor_table.py: stage 10's floor per layer on the issue's six workloads from those rates;
#   bench    `labkit bench --stages 10` on cifar10 128, 1200, 50000 and fashion, ece408 1000, 10000: each whole
#            call beside its fp32 floor and its units' floor (% of limit), cuDNN fp32 and the peer (cuDNN fp16,
#            channels_last, CUDA graph) in the same process, the end-to-end rows; bench-doc renders it;
#   e2e      tools/end_to_end_grid.py: 50000 images from host bytes on chunks {2500 ... 50000} x streams {1, 2, 4},
#            lk.whole.Job with its graphs and without (launches), host-to-device rates, per-chunk timelines, a
#            profile of the host's Python at chunks of 2500 over 4 streams;
#   tests    the GPU halves of the new tests (LABKIT_TEST_GPU=1).
# Everything lands in $OUT/perf35.tgz (the folder WORK, default /tmp/perf35, unpacking as perf35/), with steps.txt,
# the floor table, the bench table and the grid's text beside it for a first look.
set -u
OUT="${OUT:?set OUT to a folder}"
WORK="${WORK:-${TMPDIR:-/tmp}/perf35}"  # outside OUT: only the archive and four text files come back (at most 8)
BUDGET="${BUDGET:-450}"
PY="${PYTHON:-python3}"
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
step() {
  local name="$1" limit="$2"; shift 2
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "$name skipped: $SECONDS s of the $BUDGET s budget spent" | tee -a "$WORK/steps.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout "$limit" "$@" >"$WORK/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s (limit ${limit}s)" | tee -a "$WORK/steps.txt"
}
want() { [[ " $WANT " == *" $1 "* ]]; }
WANT="${*:-env rates floor bench e2e tests}"
IMAGES_CIFAR="${IMAGES_CIFAR:-128,1200,50000}"
IMAGES_FASHION="${IMAGES_FASHION:-1000,10000}"
BENCH_REPEAT="${BENCH_REPEAT:-10}"

want env && step env 60 bash -c "nvidia-smi; echo; git log -1 --format='%H %s' 2>/dev/null; \
  $PY -c 'import labkit.bench as b, json; print(json.dumps(b.versions()))'; echo; $PY -m labkit data where"
want rates && step rates 120 "$PY" tools/mma_rates.py --repeat 20 --out "$WORK" --save
[ -f results/unit_rates.json ] && cp results/unit_rates.json "$WORK/unit_rates.json"
want floor && step floor 90 "$PY" tools/floor_table.py --out "$WORK"
if want bench; then
  step bench_cifar10 240 "$PY" -m labkit bench --stages 10 --nets cifar10 --images "$IMAGES_CIFAR" \
    --repeat "$BENCH_REPEAT" --budget 2 --random-weights --out "$WORK/bench10" --force
  step bench_fashion 200 "$PY" -m labkit bench --stages 10 --nets fashion,ece408 --images "$IMAGES_FASHION" \
    --repeat "$BENCH_REPEAT" --budget 2 --random-weights --out "$WORK/bench10" --append
  step benchdoc 60 "$PY" -m labkit bench-doc "$WORK/bench10" --doc "$WORK/BENCHMARKS_perf35.md" \
    --img-dir "$WORK/bench10_img"
fi
want e2e && step e2e 240 "$PY" tools/end_to_end_grid.py --out "$WORK/e2e" --repeat "${E2E_REPEAT:-10}"
want tests && step tests 150 env LABKIT_TEST_GPU=1 "$PY" -m pytest -q -p no:cacheprovider -n 0 -rs \
  tests/test_cudnn_peer.py tests/test_floors.py tests/test_job_graphs.py tests/test_streams.py \
  tests/test_bench_whole.py tests/test_end_to_end_grid.py
# the first look, beside the archive
cp "$WORK/steps.txt" "$OUT/steps.txt" 2>/dev/null
[ -f "$WORK/floor_table.txt" ] && cp "$WORK/floor_table.txt" "$OUT/"
[ -f "$WORK/bench10/summary.md" ] && cp "$WORK/bench10/summary.md" "$OUT/bench10_summary.md"
[ -f "$WORK/e2e/e2e_grid.txt" ] && cp "$WORK/e2e/e2e_grid.txt" "$OUT/"
tar -czf "$OUT/perf35.tgz" -C "$(dirname "$WORK")" "$(basename "$WORK")"
ls -la "$OUT"
