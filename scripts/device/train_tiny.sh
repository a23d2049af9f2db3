#!/usr/bin/env bash
# Train the tiny model on the GPU machine (chapter 06a_train) within BUDGET_S seconds of training (the schedule
# follows the clock; at most MAX_STEPS steps); the weights, their record and the log land in $OUT.
#   OUT=... BUDGET_S=140 bash scripts/device/train_tiny.sh      (repository root, GPU machine; torch is the image's)
set -euo pipefail
: "${OUT:?OUT must name the output folder}"
BUDGET_S=${BUDGET_S:-420}
MAX_STEPS=${MAX_STEPS:-4000}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -u -m solar_open2.train --out "$OUT/tiny_trained.safetensors" --steps "$MAX_STEPS" --budget-s "$BUDGET_S" 2>&1 | tee "$OUT/train.log"
