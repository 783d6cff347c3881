#!/usr/bin/env bash
# The GPU check on a machine that cannot reach a package index (a lent GPU): Titan's packages and what the
# machine lacks travel as wheels, are installed beside the machine's own CUDA torch, and the check runs.
#
#   bash tools/gpu_check_offline.sh wheels             # here, with network: wheels into .whl/ (commit first)
#   TITAN_GPU_CHECK_COMMIT=<sha> bash tools/gpu_check_offline.sh run OUT [ARGS...]
#                                                      # there: install .whl/, run gpu_check, copy results + logs to OUT
#
# The machine's torch is used as it is, even outside Titan's declared range (the results record its version).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl
# What the GPU image lacks of Titan's dependencies (it has numpy, safetensors, tokenizers, tensorboard).
# TorchTitan for the side_by_side check, with only what its model and parallelize path imports (spmd_types,
# tyro and tyro's own): not its trainer's (HF datasets, wandb...): about 1.7 MB in all.
EXTRA=(torchdata==0.11.0 torchao==0.18.0 torchtitan==0.3.0 spmd_types==0.2.3 tyro==1.0.17 docstring_parser==0.18.0
  typeguard==4.6.1)
FALLBACK=(torchtitan==0.2.2)

case "${1:-}" in
wheels)
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  python -m pip wheel -q --no-deps -w "$WHEELS" packages/titan-*
  python -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" "${EXTRA[@]}"
  # An older TorchTitan, not installed: side_by_side unpacks it if the newest fails on the machine's torch.
  python -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS/fallback" "${FALLBACK[@]}"
  ls -R "$WHEELS"
  echo "built from $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  ;;
run)
  out=${2:?usage: gpu_check_offline.sh run OUT [gpu_check args...]}
  shift 2
  mkdir -p "$out"
  site=/tmp/titan-site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$WHEELS"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  # The commit comes from the sender (TITAN_GPU_CHECK_COMMIT): a .git on the machine may be a stale copy.
  : "${TITAN_GPU_CHECK_COMMIT:?set TITAN_GPU_CHECK_COMMIT to the commit the wheels were built from}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  work=/tmp/titan-gpu-check
  status=0
  # Results go to the tree's gpu_results/ first, so a run beside committed ones of the same day gets -2, -3.
  before=$(ls gpu_results)
  python3 tools/gpu_check.py --work "$work" "$@" 2>&1 | tee "$out/console.log" || status=$?
  comm -13 <(echo "$before") <(ls gpu_results) | while read -r new; do cp "gpu_results/$new" "$out/"; done
  # The logs and metrics, small enough to bring back (run folders also hold checkpoints and traces).
  (cd "$work" && find . \( -name '*.log' -o -name '*.json' -o -name 'metrics.jsonl' \) -size -4M -print0 |
    tar czf "$out/logs.tar.gz" --null -T -) || true
  exit "$status"
  ;;
*)
  sed -n 2,9p "$0" >&2
  exit 2
  ;;
esac
