#!/usr/bin/env bash
# Build the environment for one supported vLLM release: a fresh virtual environment with that release, the
# torch and transformers it pins, the plugin installed editable from this checkout (so vLLM's plugin loader
# finds its entry point) and the tools of its contract tests. CPU-capable: no GPU is needed to build or test.
#
#   bash .ci/vllm-env.sh VERSION DIR     VERSION: 0.25.1 | 0.26.0 | 0.33.0
#
# The pins live in setup.py's extras (vllm, vllm026, vllm033), so users and CI install the same thing:
#   pip install -e ".[vllm026,test]"
# Re-running with the same VERSION, DIR and setup.py does nothing (a stamp in DIR records what was installed).
# Environment: PY (the interpreter that creates the venv, default python3; 0.33.0 needs Python >= 3.11).
#   BASE=VENV: layer the new environment over an existing one of the same Python whose torch is the one this
#   release pins (CI: 0.26.0 over the project's 0.25.1 .venv, both torch 2.11.0). Its packages stay visible after
#   the new environment's own, so pip installs only what the base lacks or has at another version (into the new
#   environment: pip never removes packages outside it). Saves the ~8 GB of torch and CUDA libraries.
set -euo pipefail

version=${1:?usage: bash .ci/vllm-env.sh VERSION DIR (VERSION: 0.25.1, 0.26.0 or 0.33.0)}
dir=${2:?usage: bash .ci/vllm-env.sh VERSION DIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PY:-python3}

case "$version" in
  0.25.1) extra=vllm;    need_py=3.10 ;;
  0.26.0) extra=vllm026; need_py=3.10 ;;
  0.33.0) extra=vllm033; need_py=3.11 ;;
  *) echo "vllm-env: unsupported vLLM version '$version' (supported: 0.25.1, 0.26.0, 0.33.0)" >&2; exit 2 ;;
esac

"$py" - "$need_py" <<'EOF' || exit 2
import sys
need = tuple(map(int, sys.argv[1].split(".")))
if sys.version_info[:2] < need:
    sys.exit(f"vllm-env: {sys.executable} is Python {sys.version.split()[0]}; this vLLM release needs >= {sys.argv[1]} (set PY)")
EOF

stamp="$dir/.solar-open2-env"
want="vllm=$version extra=$extra setup=$(sha256sum "$repo/setup.py" | cut -c1-16) repo=$repo base=${BASE:-}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/bin/python" ]; then
  echo "vllm-env: $dir already has vLLM $version (stamp matches)"
  exit 0
fi

t0=$(date +%s)
[ -x "$dir/bin/python" ] || "$py" -m venv "$dir"
if [ -n "${BASE:-}" ]; then
  purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
  [ "$("$BASE/bin/python" -c 'import sys; print(sys.version_info[:2])')" = "$("$dir/bin/python" -c 'import sys; print(sys.version_info[:2])')" ] ||
    { echo "vllm-env: BASE=$BASE is another Python than $dir" >&2; exit 2; }
  "$BASE/bin/python" -c "$purelib" > "$("$dir/bin/python" -c "$purelib")/_vllm_env_base.pth"
fi
# pip's notes about configured package locations that do not hold a package, and setuptools' editable-install
# banner, are noise in a CI log: everything else pip says on stderr stays
quiet() { "$@" 2> >(grep -vE '^WARNING: Location .* is ignored|BuildBackendWarning|^ *(!!|\*+|Please be careful|name as your package|with strategy)|^ *$' >&2); }
quiet "$dir/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
quiet "$dir/bin/python" -m pip install -q --disable-pip-version-check -e "${repo}[${extra},test]"
"$dir/bin/python" - "$version" <<'EOF'
import sys
import torch, transformers, vllm
if vllm.__version__ != sys.argv[1]:
    sys.exit(f"vllm-env: asked for vLLM {sys.argv[1]}, the environment has {vllm.__version__}")
print(f"vllm-env: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"python {sys.version.split()[0]}")
EOF
echo "$want" > "$stamp"
echo "vllm-env: built $dir in $(( $(date +%s) - t0 )) s ($(du -sm "$dir/" | cut -f1) MiB)"
