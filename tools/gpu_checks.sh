#!/usr/bin/env bash
# The GPU half of this wave's checks, in one call on a CUDA machine (docs/gpu.md): the sandbox reaches the GPU, the
# grader's and self-check's verdicts on the wrong CUDA C kernels and on the wrong-submission class, the GPU tests of
# the new modules, and memcheck. Each step's output goes to OUT/<step>.txt, its exit code and seconds to
# OUT/steps.txt; OUT/all.tgz holds every file.
#   OUT=DIR bash tools/gpu_checks.sh [STEP ...]     (default: every step)
set -u
OUT="${OUT:?set OUT to a folder}"
mkdir -p "$OUT/files"
PY="${PYTHON:-python3}"
step() {
  local name="$1"; shift
  local t0=$SECONDS
  timeout "${STEP_LIMIT:-400}" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/steps.txt"
}
want() { [ $# -eq 0 ] || [[ " $WANT " == *" $1 "* ]]; }
WANT="${*:-sandbox cudac tests wrong memcheck}"  # and: notebooks probe stage10 tune1200 fcgemm winograd wexplore tctests tc tcexplore nb10 bench nbruns load spread gradetests phases parent
want sandbox && step sandbox "$PY" tools/sandbox_gpu_check.py --out "$OUT/files/sandbox"
want cudac && [ -f tools/cuda_c_wrong_kernels.py ] && step cudac "$PY" tools/cuda_c_wrong_kernels.py --out "$OUT/files/cudac"
want tests && step tests env LABKIT_TEST_GPU=1 "$PY" -m pytest -q -p no:cacheprovider -rs \
  tests/test_grade_cuda_c.py tests/test_lessons.py tests/test_boundaries.py tests/test_show.py tests/test_check.py \
  $(ls tests/test_cuda_cpu.py 2>/dev/null)
want notebooks && step notebooks "$PY" -m pytest -q -p no:cacheprovider --nbval-lax ${NOTEBOOKS:-solutions/06_constant_memory.ipynb solutions/09_per_layer_tuning.ipynb}
want wrong && step wrong "$PY" tests/wrong_submissions.py --table --no-selfcheck --json "$OUT/files/wrong_gpu.json" \
  --kinds ${WRONG_KINDS:-cuda_c_wrong_source untimed_layer memo_content timed_only_library pad_border_nan}
want probe && [ -f tools/whole_job_probe.py ] && step probe "$PY" tools/whole_job_probe.py --out "$OUT/files/probe"
want stage10 && step stage10 env LABKIT_TEST_GPU=1 "$PY" -m pytest -q -p no:cacheprovider -n 0 -rs \
  tests/test_streams.py tests/test_bench_whole.py tests/test_split_k.py tests/test_gemm.py tests/test_gemm_cuda.py tests/test_fc_gemm_timing.py \
  tests/test_winograd.py tests/test_tensor_cores.py tests/test_fc_tensor_cores.py tests/test_unfinished.py tests/test_tune.py
want tune1200 && step tune1200 "$PY" tools/tune_workload.py cifar10 1200 --save && cp results/tuning.json "$OUT/files/tuning.json"
want recheck && step recheck "$PY" tools/recheck_candidate.py cifar10 conv2 "09 tiles weights_in=shared tpb=128 split=3 rows=4" --times 20
want fcgemm && step fcgemm "$PY" tools/fc_gemm_timing.py --out "$OUT/files/fc_gemm"
want winograd && step winograd "$PY" tools/conv_timing.py --kernels winograd --out "$OUT/files/winograd"
want wexplore && step wexplore "$PY" tools/conv_timing.py --kernels winograd --explore --repeat 10 --out "$OUT/files/winograd"
want tctests && step tctests env LABKIT_TEST_GPU=1 "$PY" -m pytest -q -p no:cacheprovider -n 0 -rs \
  tests/test_tensor_cores.py tests/test_conv_banks.py
want tc && step tc "$PY" tools/conv_timing.py --kernels tc --out "$OUT/files/tc"
want tcexplore && step tcexplore "$PY" tools/conv_timing.py --kernels tc --explore --repeat ${TC_REPEAT:-10} ${TC_WORKLOADS:+--workloads $TC_WORKLOADS} --save --out "$OUT/files/tc" && cp results/tensor_cores.json "$OUT/files/tensor_cores.json"
want nb10 && step nb10 "$PY" tools/execute_solutions.py --gpu --out "$OUT/files/notebooks" 10
want bench && step bench labkit bench ${BENCH_STAGES:+--stages $BENCH_STAGES} --nets ${BENCH_NETS:-cifar10,fashion,ece408} --repeat ${BENCH_REPEAT:-5} --budget ${BENCH_BUDGET:-2} \
  --per-image-max ${BENCH_PER_IMAGE_MAX:-1200} --skip '02 cpu_prange_reduction' --random-weights --out "$OUT/files/bench"
want memcheck && step memcheck "$PY" tools/memcheck.py --out "$OUT/files/memcheck" --stages 05 09
# issue 32: the notebooks whose run failed once, several times, every traceback kept; the same class graded at
# --jobs 1 and --jobs N (LOAD_ONLY=jobs1|loaded to split the runs over calls); the GPU tests of the turns and streams
want nbruns && step nbruns "$PY" tools/execute_solutions.py --gpu --runs ${NB_RUNS:-2} --out "$OUT/files/notebooks" ${NB_PREFIXES:-09 10}
want load && step load "$PY" tools/load_grading.py "${LOAD_DIR:-$OUT/files/load}" --jobs ${LOAD_JOBS:-14} \
  --runs ${LOAD_RUNS:-3} --stages ${LOAD_STAGES:-05,10} --load ${LOAD_COPIES:-0} ${LOAD_STUDENTS:+--students $LOAD_STUDENTS} \
  ${LOAD_ONLY:+--only $LOAD_ONLY}
# issue 32's open point: does one process launch slower than another because of its hash seed, its address layout, or
# the core's own speed (tools/launch_spread.py)
want spread && step spread "$PY" tools/launch_spread.py --processes ${SPREAD_PROCESSES:-8} --out "$OUT/files/spread"
want gradetests && step gradetests env LABKIT_TEST_GPU=1 "$PY" -m pytest -q -p no:cacheprovider -n 0 -rs \
  tests/test_grade_load.py tests/test_stream_order.py tests/test_streams.py tests/test_tasks.py
# issue 33: what each phase of a graded job costs on this device, and the jobs per hour (tools/phase_costs.py: a mix
# of stages 04-10 at --jobs 1, the reference jobs run; PHASE_BUDGET: no stage starts after it; the parent's part
# at the GPU's sizes, tools/parent_costs.py, beside it)
want phases && step phases "$PY" tools/phase_costs.py "$OUT/files/phases" --budget ${PHASE_BUDGET:-400} \
  --correct ${PHASE_CORRECT:-1} --wrong ${PHASE_WRONG:-1} ${PHASE_STAGES:+--stages $PHASE_STAGES}
want parent && step parent "$PY" tools/parent_costs.py "$OUT/files/parent" --repeat ${PARENT_REPEAT:-3}
tar czf "$OUT/all.tgz" -C "$OUT" files
