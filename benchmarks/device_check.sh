#!/bin/bash
# The device check of issue 29.6 as one call of the device tool (docs/benchmarks-trainer.md,
# "The device check"). The device machine has torch and most of the project's needs but not
# pydantic, apscheduler, cryptography and their own needs: download their wheels here first,
# into .whl/ (ignored by git), and name .whl in the call's carry:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl APScheduler tzlocal pydantic pydantic_core \
#     annotated-types typing-inspection argcomplete cryptography cffi pycparser typing_extensions
#
# then run: QUICK_S=330 TEST_S=45 bash benchmarks/device_check.sh   (timeout_s about 400).
# What comes back under $OUT: env.txt (card, driver, torch, NCCL), quick.txt (gpu.py --quick,
# each figure as it ends, then its one JSON line), pytest.txt (the tests that skip without
# CUDA), logs.tgz (every figure's and probe's log).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "device_check: the wheels in .whl did not install"; exit 3; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c 'import sys, torch; c = torch.cuda.is_available(); print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if c else None, torch.cuda.get_device_name() if c else "no cuda")'
  $PY -c 'import trainer.worker.loop, trainer.control.decide, benchmarks.nccl_probes; print("imports ok")'
} 2>&1 | tee "$OUT/env.txt"
timeout "${QUICK_S:-400}" $PY benchmarks/gpu.py ${QUICK_ARGS:---quick} --workdir /tmp/g 2>&1 | tee "$OUT/quick.txt"
echo "quick rc=$?" | tee -a "$OUT/quick.txt"
if [ "${TEST_S:-60}" != 0 ]; then
  timeout "${TEST_S:-60}" $PY -m pytest -q -p no:cacheprovider --timeout 50 \
    tests/trainer/data/test_feed.py::test_batches_land_on_the_gpu \
    tests/trainer/state/test_training.py::test_a_host_copy_of_gpu_state_is_pinned_and_complete \
    2>&1 | tail -15 | tee "$OUT/pytest.txt"
fi
(cd /tmp/g 2>/dev/null && find . -name '*.log' -size -4M | tar czf "$OUT/logs.tgz" -T -)
ls -la "$OUT"
