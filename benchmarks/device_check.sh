#!/usr/bin/env bash
# One prepared run for a GPU machine (e.g. the device machine, whose python3 has CUDA torch,
# h5py, pyyaml, psutil, tqdm, matplotlib and hypothesis; nothing is fetched). About 5 minutes:
#   bash benchmarks/device_check.sh            # logs in ${OUT:-/tmp/device_check}
# 1. the CUDA tests (tests/test_gpu.py) and the suites that exercise the mixing kernel, keyed
#    dropout and the batched engine on whatever device they find;
# 2. benchmarks/decentralized.py and benchmarks/engine.py on cuda (numbers for RESULTS.md);
# 3. one real DSpodFL run with the models on the GPU.
# Not covered: NCCL between ranks needs one GPU per rank (NCCL refuses two ranks on one GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_check}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of this script on a machine without a GPU
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
status=0
step() {  # step NAME CMD...: at most 4 minutes each, so one hang cannot eat the device budget
  local name=$1; shift; echo "== $name"; timeout 240 "$@" 2>&1 | tee "$OUT/$name.log" || status=1
}

echo "== environment" | tee "$OUT/env.log"
{ nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } \
  2>&1 | tee -a "$OUT/env.log"
if [ "$DEVICE" = cuda ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "no CUDA device visible to $PY (DEVICE=cpu for a dry run)"; exit 1
fi
rm -f "$OUT/run.h5"; rm -rf "$OUT/run.h5.ckpt"
step tests $PY -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py tests/test_exchange.py tests/test_models.py \
  tests/test_engine.py tests/test_rng.py -k "not mpi"
step decentralized $PY benchmarks/decentralized.py --device $DEVICE --clients 100 1000
step engine $PY benchmarks/engine.py --device $DEVICE --quick
cat > "$OUT/run.yaml" <<'YAML'
name: device-dspodfl
rounds: 200
eval_every: 100
task: {dataset: synthetic, clients: 200, model: mlp, hidden: 64,
       partition: {kind: dirichlet, alpha: 0.3},
       synthetic: {samples: 20000, test_samples: 2000, features: 64, classes: 10}}
train: {batch_size: 16, lr: 0.05}
algorithm: {name: dspodfl}
topology: {kind: rgg, radius: 0.15}
YAML
step run $PY -m fedmpi run "$OUT/run.yaml" --out "$OUT/run.h5" --quiet --set runtime.device=$DEVICE
step info $PY -m fedmpi info "$OUT/run.h5"
echo "== done (status $status); logs in $OUT"
exit $status
