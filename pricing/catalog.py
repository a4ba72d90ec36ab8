"""Instance type -> GPU model and count, GPU name normalisation, and a throughput prior.

Design: static tables, no I/O. The optimiser needs, for every offering, how many GPUs of
which model it buys and roughly how fast one such GPU trains relative to a V100; the trainer
later replaces the prior with measured speed. Families are described by a rule (the size
suffix gives the GPU count) plus a table of exceptions, so new sizes of a known family work.

Rule for callers: pass GPU names through :func:`canonical_gpu` before comparing them;
:func:`gpu_for` returns ``None`` for a type without GPUs or one this table does not know
(never a guess).
"""

from __future__ import annotations

import functools
import re

from pricing.model import GpuSpec

# --- canonical GPU names ---------------------------------------------------------------------

#: Canonical names and their memory in GiB per GPU.
GPU_MEMORY_GIB: dict[str, float] = {
    "K80": 12, "K520": 4, "M60": 8, "P4": 8, "P100": 16, "V100": 16, "V100-32GB": 32,
    "T4": 16, "A10": 24, "A10G": 24, "L4": 24, "L40S": 48, "A100-40GB": 40, "A100-80GB": 80,
    "H100": 80, "H200": 141, "RTX6000-ADA": 48, "RTX-PRO-6000": 96,
}

_ALIASES: dict[str, str] = {
    "a100": "A100-40GB", "a10040gb": "A100-40GB", "a100-40gb": "A100-40GB",
    "a10080gb": "A100-80GB", "a100-80gb": "A100-80GB",
    "h10080gb": "H100", "h100-80gb": "H100", "h100-80gb-mega": "H100", "h100mega80gb": "H100",
    "h100": "H100", "h10080gbmega": "H100", "h200": "H200", "h200141gb": "H200",
    "v10032gb": "V100-32GB", "v10016gb": "V100", "v100": "V100",
    "rtx6000": "RTX-PRO-6000", "rtxpro6000": "RTX-PRO-6000",
    "rtx6000ada": "RTX6000-ADA", "l40s": "L40S",
}


@functools.lru_cache(maxsize=4096)
def canonical_gpu(name: str) -> str:
    """Normalise a GPU name: ``"nvidia-tesla-v100"``, ``"v100"``, ``"Tesla V100"`` -> ``"V100"``.

    Vendor prefixes (nvidia, tesla), separators and case are ignored; the GCP price file's
    keys (``a100``, ``a100-80gb``, ``h100-80gb-mega``, ``rtx6000``) map to the canonical
    names of :data:`GPU_MEMORY_GIB`. An unknown name comes back upper-cased and stripped of
    prefixes, so two spellings of an unknown GPU still compare equal.
    """
    s = name.strip().lower()
    for prefix in ("nvidia-tesla-", "nvidia tesla ", "nvidia-", "nvidia ", "tesla-", "tesla "):
        if s.startswith(prefix):
            s = s[len(prefix):]
    s = s.replace("-vws", "")
    if s in _ALIASES:
        return _ALIASES[s]
    squashed = re.sub(r"[\s_\-]", "", s)
    if squashed in _ALIASES:
        return _ALIASES[squashed]
    for canon in GPU_MEMORY_GIB:
        if squashed == re.sub(r"[\s_\-]", "", canon.lower()):
            return canon
    return re.sub(r"[\s_]+", "-", s).upper()


# --- instance types --------------------------------------------------------------------------

#: Exact AWS types whose GPU count does not follow a family rule.
_AWS_EXACT: dict[str, tuple[str, int]] = {
    "p2.xlarge": ("K80", 1), "p2.8xlarge": ("K80", 8), "p2.16xlarge": ("K80", 16),
    "p3.2xlarge": ("V100", 1), "p3.8xlarge": ("V100", 4), "p3.16xlarge": ("V100", 8),
    "p3dn.24xlarge": ("V100-32GB", 8),
    "p4d.24xlarge": ("A100-40GB", 8), "p4de.24xlarge": ("A100-80GB", 8),
    "p5.48xlarge": ("H100", 8), "p5e.48xlarge": ("H200", 8), "p5en.48xlarge": ("H200", 8),
    "g2.2xlarge": ("K520", 1), "g2.8xlarge": ("K520", 4),
    "g3s.xlarge": ("M60", 1), "g3.4xlarge": ("M60", 1), "g3.8xlarge": ("M60", 2),
    "g3.16xlarge": ("M60", 4),
    "g4dn.12xlarge": ("T4", 4), "g4dn.metal": ("T4", 8),
}
#: AWS families with one GPU per size except the multi-GPU sizes listed.
_AWS_FAMILIES: dict[str, tuple[str, dict[str, int]]] = {
    "g4dn": ("T4", {}),
    "g5": ("A10G", {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    "g6": ("L4", {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    "g6e": ("L40S", {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
}
#: GCP machine families with a GPU bundled: (GPU, count from the name).
_G2_COUNT = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
_G4_COUNT = {48: 1, 96: 2, 192: 4, 384: 8}


def _gcp_bundled(t: str) -> tuple[str, int] | None:
    m = re.fullmatch(r"a2-(highgpu|megagpu|ultragpu)-(\d+)g", t)
    if m:
        return ("A100-80GB" if m.group(1) == "ultragpu" else "A100-40GB", int(m.group(2)))
    m = re.fullmatch(r"a3-(highgpu|megagpu|edgegpu|ultragpu)-(\d+)g", t)
    if m:
        return ("H200" if m.group(1) == "ultragpu" else "H100", int(m.group(2)))
    m = re.fullmatch(r"g2-standard-(\d+)", t)
    if m and int(m.group(1)) in _G2_COUNT:
        return ("L4", _G2_COUNT[int(m.group(1))])
    m = re.fullmatch(r"g4-standard-(\d+)", t)
    if m and int(m.group(1)) in _G4_COUNT:
        return ("RTX-PRO-6000", _G4_COUNT[int(m.group(1))])
    return None


@functools.lru_cache(maxsize=4096)
def gpu_for(instance_type: str) -> GpuSpec | None:
    """The GPUs of an AWS or GCP instance type, or ``None`` (no GPU, or not known).

    GCP N1 VMs with attached accelerators are written ``<machine>+<gpu>[x<count>]``
    (``n1-standard-8+v100x2``, ``n1-highmem-4+nvidia-tesla-k80``), the spelling the trace
    loader uses for the 2019 preemptible lifetimes.
    """
    t = instance_type.strip().lower()
    found: tuple[str, int] | None = None
    if "+" in t:
        _machine, _, accel = t.partition("+")
        m = re.fullmatch(r"(.+?)(?:x(\d+))?", accel)
        if m:
            found = (canonical_gpu(m.group(1)), int(m.group(2) or 1))
    elif t in _AWS_EXACT:
        found = _AWS_EXACT[t]
    elif "." in t:
        family, _, size = t.partition(".")
        if family in _AWS_FAMILIES:
            gpu, multi = _AWS_FAMILIES[family]
            found = (gpu, multi.get(size, 1))
    else:
        found = _gcp_bundled(t)
    if found is None:
        return None
    model, count = found
    return GpuSpec(model=model, count=count, memory_gib=GPU_MEMORY_GIB.get(model))


# --- relative training throughput prior -------------------------------------------------------

#: Relative training throughput per GPU (V100 = 1.0), mixed precision (fp16/AMP), one GPU.
#:
#: Lambda rows: the geometric mean over the 9 models (bert_base_squad, bert_large_squad, gnmt,
#: resnet50, tacotron2, transformerxlbase, transformerxllarge, waveglow, ssd) of the 1-GPU
#: throughput divided by "LambdaCloud V100 16GB", in lambdal/deeplearning-benchmark
#: ``pytorch/pytorch-train-throughput-fp16.csv`` at commit 4e11f689 (2024-07-24), computed on
#: 2026-11-21 from ../shared/data/gpu_throughput (tests/pricing/test_catalog.py recomputes
#: them). fp16 was chosen over fp32 because the fp32 table runs TF32 on A100/H100, which
#: inflates those ratios (A100-80GB 4.64 fp32 vs 2.85 fp16) beyond what AMP training sees.
#: A100-40GB: the table has only the PCIe card (2.29); GCP a2-highgpu and AWS p4d use SXM4,
#: scaled by SXM4/PCIe = 2.06/1.88 from the 2022-07-06 version of the same table -> 2.51.
LAMBDA_FP16_PRIOR: dict[str, float] = {
    "V100": 1.00,
    "A100-40GB": 2.51,
    "A100-80GB": 2.85,   # "A100 80GB SXM4"
    "H100": 4.77,        # "H100 80GB SXM5" (a3-highgpu and p5 are SXM)
    "A10": 0.92,         # "LambdaCloud A10"
    "RTX6000-ADA": 1.96,
}

#: GPUs absent from the Lambda tables: coarse figures, not recomputed from data here (no public
#: table with these GPUs was reachable; see ../shared/data/README.md "Not obtained"):
#: - K80 0.20, P100 0.55: the order of the ratios in the ICAC 2019 transient-servers study
#:   (Li, Walls, Guo; cake-lab/transient-deep-learning), where K80 steps are several times
#:   and P100 steps about twice as slow as V100 ones.
#: - T4 0.35, A10G 0.85, L4 0.55, M60 0.15, K520 0.08: memory bandwidth relative to the
#:   V100's 900 GB/s (NVIDIA data sheets: T4 320, A10G 600, L4 300, M60 160 and K520 160 per
#:   GPU), adjusted up for tensor cores (T4/A10G/L4) and down without them (M60/K520); A10G
#:   is the A10 die at lower clocks, so 0.85 < the measured A10 0.92.
#: - V100-32GB = V100. L40S 1.96 and RTX-PRO-6000 1.96: the RTX 6000 Ada figure above (same
#:   Ada die as L40S; the Blackwell PRO 6000 is at least as fast), a conservative lower bound.
#: - H200 4.77: the H100 figure (same compute, more memory bandwidth), conservative.
#: The trainer replaces every prior with measured step times.
PUBLISHED_PRIOR: dict[str, float] = {
    "K80": 0.20, "P100": 0.55, "T4": 0.35, "A10G": 0.85, "L4": 0.55, "M60": 0.15,
    "K520": 0.08, "P4": 0.20, "V100-32GB": 1.00, "L40S": 1.96, "RTX-PRO-6000": 1.96,
    "H200": 4.77,
}


def relative_throughput(gpu_model: str) -> float:
    """Prior relative training throughput of one GPU of ``gpu_model`` (V100 = 1.0).

    Raises ``KeyError`` naming the model when it has no figure (the caller decides whether
    to skip the offering; no silent default).
    """
    canon = canonical_gpu(gpu_model)
    if canon in LAMBDA_FP16_PRIOR:
        return LAMBDA_FP16_PRIOR[canon]
    if canon in PUBLISHED_PRIOR:
        return PUBLISHED_PRIOR[canon]
    raise KeyError(f"no throughput prior for GPU {gpu_model!r} (canonical {canon!r}); "
                   f"known: {', '.join(sorted({**LAMBDA_FP16_PRIOR, **PUBLISHED_PRIOR}))}")
