#!/usr/bin/env bash
# Train the tiny model on the GPU machine (chapter 06a_train) within BUDGET_S seconds of training (the schedule
# follows the clock; at most MAX_STEPS steps); the weights, their record and the log land in $OUT.
#   OUT=... BUDGET_S=420 bash scripts/device/train_tiny.sh      (repository root, GPU machine; torch is the image's)
# RUNS="BATCH:LR[:SEED] ..." (default "32:2e-3:0") trains one model per entry, all at once on the one GPU (a model this
# small leaves the GPU mostly idle, so the runs overlap), into $OUT/run-N/; each run's evaluation is printed, and the
# best (recall, then the capitals in the chat template, then copying) is copied to $OUT/best.safetensors (+ .json)
# and, when BEST_DIR is set, to $BEST_DIR/ too (a later call on the same warm machine can use it).
# TRAIN_ARGS: more options for every run (e.g. "--recall-frac 0.7 --all-queries --kda-chunk 32 --init trained");
# RUN_ARGS_N: more options for run N alone (1-based, in RUNS' order), e.g. RUN_ARGS_2="--init trained".
# WORK (default $OUT): where the runs' folders go. The device returns at most 8 files of 16 MiB from $OUT, so with
# WORK outside $OUT only the logs, the best run's record and its weights (split into 15 MiB parts, best.safetensors.part-*)
# land in $OUT: reassemble with `cat best.safetensors.part-* > best.safetensors` (its sha256 is in the record).
# FLA's Triton kernels for the KDA layers (TRAIN_ARGS="--kda-kernel fla", chapter 06a_train): `bash scripts/device/prepare.sh
# fla` stages their wheels in .stage-fla/ here; carry [".stage-fla"] and this script installs them (no network there)
# into FLA_SITE (default /tmp/fla-site) before training, when the image has no `fla`. FLA_WHEELS names another folder.
# Measured on the H200 (2026-12-03): one run at batch 32 takes 0.35 s a step (the GPU waits on Python); four at once
# 0.8-1.65 s a step each; evaluating and saving take about a minute after the budget, so keep BUDGET_S at least
# 150 s under the device call's limit.
set -euo pipefail
: "${OUT:?OUT must name the output folder}"
BUDGET_S=${BUDGET_S:-420}
MAX_STEPS=${MAX_STEPS:-100000}
SEQ=${SEQ:-256}
RUNS=${RUNS:-32:2e-3:0}
read -r -a EXTRA <<< "${TRAIN_ARGS:-}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
FLA_WHEELS=${FLA_WHEELS:-.stage-fla}
if compgen -G "$FLA_WHEELS/*.whl" > /dev/null && ! python3 -c "import fla" 2> /dev/null; then
  FLA_SITE=${FLA_SITE:-/tmp/fla-site}
  python3 -m pip install -q --no-deps --no-index --target "$FLA_SITE" "$FLA_WHEELS"/*.whl
  export PYTHONPATH="$PYTHONPATH:$FLA_SITE"
  echo "FLA's kernels from $FLA_WHEELS installed into $FLA_SITE"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no nvidia-smi: training on the CPU"
WORK=${WORK:-$OUT}
i=0; pids=()
for r in $RUNS; do
  IFS=: read -r batch lr seed <<< "$r"
  i=$((i + 1)); d="$WORK/run-$i"; mkdir -p "$d"
  own_var=RUN_ARGS_$i; read -r -a OWN <<< "${!own_var:-}"
  echo "== run-$i: --batch $batch --lr $lr --seed ${seed:-0} --seq $SEQ --budget-s $BUDGET_S ${TRAIN_ARGS:-} ${!own_var:-}"
  python3 -u -m solar_open2.train --out "$d/tiny_trained.safetensors" --steps "$MAX_STEPS" --budget-s "$BUDGET_S" \
    --batch "$batch" --lr "$lr" --seed "${seed:-0}" --seq "$SEQ" "${EXTRA[@]}" "${OWN[@]}" > "$d/train.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for d in "$WORK"/run-*; do echo "== $(basename "$d"):"; tail -n 3 "$d/train.log"; done
python3 - "$OUT" "${BEST_DIR:-}" "$WORK" <<'PY'
import json, shutil, sys
from pathlib import Path
out, best_dir, work = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
recs = []
for f in sorted(work.glob("run-*/tiny_trained.safetensors.json")):
    r = json.loads(f.read_text()); e = r["eval_on_device"]
    recs.append(((e["recall"]["accuracy"], e["facts"]["chat"], e.get("copy", 0)), f.with_suffix(""), r))
    print(f"{f.parent.name}: steps {r['steps']} batch {r['batch']} lr {r['lr']} seed {r['seed']} recall {e['recall']['accuracy']:.3f} "
          f"facts {e['facts']} copy {e.get('copy')} final loss {r['log'][-1]['loss']}")
if not recs: sys.exit("train_tiny.sh: no run finished")
key, f, r = max(recs, key=lambda x: x[0])
for dest in [out] + ([Path(best_dir)] if best_dir else []):
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(f, dest / "best.safetensors"); shutil.copyfile(f"{f}.json", dest / "best.safetensors.json")
print(f"best: {f.parent.name} (recall, facts chat, copy) = {key}, sha256 {r['sha256']}")
if work != out:                                   # the device returns few, small files: logs, the record, the weights in parts
    for d in sorted(work.glob("run-*")): shutil.copyfile(d / "train.log", out / f"{d.name}.log")
    data = (out / "best.safetensors").read_bytes(); (out / "best.safetensors").unlink()
    step = 15 << 20
    for i in range(0, len(data), step): (out / f"best.safetensors.part-{i // step:02d}").write_bytes(data[i:i + step])
PY
exit $rc
