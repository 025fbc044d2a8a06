#!/usr/bin/env bash
# What issue 12 measures on a GPU, in stages that each fit one call of the device tool (< 10 min).
# From the repository root of a CUDA machine:
#   benchmarks/gpu_session.sh tests   # CUDA-marked tests, the engine's sync and op-count tests (~2 min)
#   benchmarks/gpu_session.sh round   # one DP-FTS-DE round at N = 1,000 / 10,000 / 100,000, profiled (~5 min)
#   benchmarks/gpu_session.sh cnn     # batched CNN training, K = 1, 10, 50, 250 (~3 min)
#   benchmarks/gpu_session.sh large   # rounds of 300,000 and 1,000,000 agents, chunked by free memory (~4 min)
# Results land in benchmarks/results/ (round_time_cuda*.json, cnn_training_cuda.json, plots) and,
# where the variable OUT names a folder (the device tool's), are copied there too.
# The lent GPU machines have no opacus: wheels carried in .whl/ (device README) are installed
# first; without them the round runs its mechanism unaccounted and the privacy tests are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: these stages need a GPU')"
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
out() { if [ -n "${OUT:-}" ]; then for f in "$@"; do if [ -e "$f" ]; then cp "$f" "$OUT"/; fi; done; fi; }
case "${1:-}" in
  tests)  # both runs even if the first fails; the stage fails if either did
    rc=0
    $PY -m pytest -q -p no:cacheprovider -m cuda tests 2>&1 | tee /tmp/cuda_tests.log || rc=1
    $PY -m pytest -q -p no:cacheprovider tests/federation/test_engine.py tests/benchmarks/test_op_budget.py tests/utils/test_cuda_graphs.py \
      2>&1 | tee -a /tmp/cuda_tests.log || rc=1
    out /tmp/cuda_tests.log
    exit $rc ;;
  round)
    $PY benchmarks/round_time.py --device cuda --N 1000 10000 100000 --M 100 --D 3 --profile --cell-budget 300
    out benchmarks/results/round_time_cuda.json benchmarks/results/round_time_cuda.png ;;
  large)
    $PY benchmarks/round_time.py --device cuda --N 300000 1000000 --M 100 --D 3 --cell-budget 400 --tag cuda_large
    out benchmarks/results/round_time_cuda_large.json benchmarks/results/round_time_cuda_large.png ;;
  cnn)
    $PY benchmarks/cnn_training.py --device cuda
    out benchmarks/results/cnn_training_cuda.json benchmarks/results/cnn_training_cuda.png ;;
  *)
    echo "usage: $0 tests|round|large|cnn" >&2; exit 2 ;;
esac
