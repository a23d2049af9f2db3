#!/usr/bin/env bash
# The plugin's contract tests against every supported vLLM release, each in its own environment.
#
#   bash .ci/contract.sh [VERSION...]      default: 0.25.1 0.26.0 0.33.0
#
# 0.25.1 runs in the project's .venv (built by `make setup`, the default `[vllm]` extra; or $SOLAR_OPEN2_VENV); the others in
# environments that .ci/vllm-env.sh builds under $SOLAR_OPEN2_VENVS (default .venvs/, git-ignored).
# The contract: vLLM's plugin loader registers the plugin in a fresh process; the model builds on the tiny config;
# load_weights takes every checkpoint tensor and fills every parameter, values bit-checked, in every layout; the
# ignore lists resolve; the real config gives the 1072-token block; the parsers run through vLLM's parser managers;
# the KDA layer matches the reference on the CPU bench; every moved vLLM name comes through solar_open2.vllm.compat.
# VLLM_ENV_BASE_<version with _ for .>=VENV layers that release's environment over VENV (.ci/vllm-env.sh's BASE).
# Each version's pytest summary line is printed after a "== contract vLLM X" header; the script exits non-zero if
# any version failed, after running them all.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
repo=$PWD
venvs=${SOLAR_OPEN2_VENVS:-$repo/.venvs}
main_venv=${SOLAR_OPEN2_VENV:-$repo/.venv}         # the project's own environment, vLLM 0.25.1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1

# the contract suite: one list, run whole against each release
CONTRACT_TESTS=(
  tests/test_vllm_compat.py
  tests/test_plugin_entry_point.py
  tests/test_plugin_cpu.py
  tests/test_chat_vllm.py
)

versions=("$@")
[ ${#versions[@]} -eq 0 ] && versions=(0.25.1 0.26.0 0.33.0)
failed=()
summary=()
for v in "${versions[@]}"; do
  echo "== contract vLLM $v"
  t0=$(date +%s)
  if [ "$v" = 0.25.1 ] && [ -x "$main_venv/bin/python" ]; then
    py=$main_venv/bin/python
  else
    base_var=VLLM_ENV_BASE_${v//./_}                 # e.g. VLLM_ENV_BASE_0_26_0=.venv: layer it over that one
    base=${!base_var:-}
    [ -z "$base" ] || base=$(cd "$base" && pwd)
    if ! BASE=$base bash .ci/vllm-env.sh "$v" "$venvs/vllm-$v"; then
      failed+=("$v (environment)"); summary+=("vLLM $v: environment not built"); continue
    fi
    py=$venvs/vllm-$v/bin/python
  fi
  t1=$(date +%s)
  log=$(mktemp)
  PYTHONPATH=$repo "$py" -m pytest -q -p no:cacheprovider "${CONTRACT_TESTS[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  line=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|no tests ran|^(=+ )?[0-9]+ error' "$log" | tail -1 | sed 's/^=* *//; s/ *=*$//')
  rm -f "$log"
  summary+=("vLLM $v: ${line:-no summary} (environment $(( t1 - t0 )) s, tests $(( $(date +%s) - t1 )) s)")
  [ "$rc" -eq 0 ] || failed+=("$v")
done
echo "== contract summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "contract tests failed on vLLM ${failed[*]}"
  exit 1
fi
