#!/usr/bin/env bash
# The device checks of a session lent a GPU, as one script: doctor, the CUDA tests, the benchmarks with
# --device cuda, a reproduction for as long as is left, then the suite. Each step has its own timeout and
# writes under $OUT (all of it packed into $OUT/checks.tar.gz at the end: the tool returns at most 8 files).
#
# Prepare, on the development machine, in the repository root (the device machine reaches no registry and
# has its own Python 3.12 with torch; these wheels fill what it lacks; 64 MiB travel in all):
#   echo /.devrun/ >> .git/info/exclude; mkdir -p .devrun/whl .devrun/bench
#   cp ../shared/datasets/benchmarks/*.tar.gz .devrun/bench/
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .devrun/whl \
#     polars==1.30.0 pystow captum pykeen==1.11.1 more-itertools dataclasses-json marshmallow typing-inspect \
#     click-default-group more-click docdata class-resolver torch-max-mem torch-ppr backports-zstd
# then run it with the device tool: command "bash benchmarks/gpu_checks.sh", carry [".devrun"].
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LIMIT=${LIMIT:-540}  # seconds for the whole script
step() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/steps.log"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devrun/whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src:$PWD KGTRACE_DATASETS_MIRROR=$PWD/.devrun/bench KGTRACE_HOME=/tmp/kghome
step start; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
step doctor; timeout 150 python3 -m kgtrace doctor --device cuda > "$OUT/doctor.txt" 2>&1
step "cuda tests"; timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_loss.py tests/test_models.py -k cuda \
  > "$OUT/pytest-cuda.txt" 2>&1
step "train step at scale"; timeout 120 python3 benchmarks/train_memory.py --device cuda --entities 1097020 \
  --triples 10341769 --batch 128 > "$OUT/train-memory.json" 2>&1
step "eval vs pykeen"; timeout 150 python3 benchmarks/eval_vs_pykeen.py --dataset fb15k237 --device cuda \
  --cell-timeout 100 --no-compile > "$OUT/eval-vs-pykeen.json" 2> "$OUT/eval.err"
step "tracin vs captum"; timeout 240 python3 benchmarks/tracin_vs_captum.py --dataset fb15k237 --epochs 2 \
  --checkpoint-every 1 --n-test 1,100 --repeats 1 --device cuda --cell-timeout 60 > "$OUT/tracin-vs-captum.json" \
  2> "$OUT/tracin.err"
step reproduce; timeout $(( $(left) / 2 )) python3 benchmarks/reproduce.py conve-code-fb15k237 --device cuda \
  --hours $(python3 -c "print(max(0.01, $(left) / 2 / 3600 - 0.01))") --runs /tmp/repro --results "$OUT" \
  > "$OUT/reproduce.txt" 2>&1
step suite; timeout $(( $(left) - 20 )) python3 -m pytest -q -p no:cacheprovider -n 16 --ignore tests/test_workflow.py \
  --ignore tests/test_report_browser.py --ignore tests/test_layers.py -v > "$OUT/pytest.txt" 2>&1  # -v: each result as it comes
step done
tar -czf /tmp/checks.tar.gz -C "$OUT" . && mv /tmp/checks.tar.gz "$OUT/checks.tar.gz"
grep -E "FAILED|ERROR" "$OUT/pytest.txt" | head -20; tail -3 "$OUT/pytest.txt" "$OUT/pytest-cuda.txt"; tail -12 "$OUT/doctor.txt"
