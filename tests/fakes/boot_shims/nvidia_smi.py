"""``nvidia-smi -L`` of a fake instance: $SPOTRING_FAKE_GPUS GPUs; none: the driver's failure."""

import os
import sys

n = int(os.environ.get("SPOTRING_FAKE_GPUS", "0"))
if n <= 0:
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    sys.exit(9)
for i in range(n):
    print(f"GPU {i}: NVIDIA A10G (UUID: GPU-00000000-0000-0000-0000-{i:012d})")
