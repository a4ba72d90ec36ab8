"""Catalog: instance type -> GPUs, name normalisation, and the throughput prior recomputed
from the real Lambda table."""

from __future__ import annotations

import csv
import math

import pytest

from pricing.catalog import LAMBDA_FP16_PRIOR, canonical_gpu, gpu_for, relative_throughput


@pytest.mark.parametrize("name,canon", [
    ("nvidia-tesla-v100", "V100"), ("v100", "V100"), ("Tesla V100", "V100"),
    ("nvidia-tesla-k80", "K80"), ("nvidia-a100-80gb", "A100-80GB"), ("a100", "A100-40GB"),
    ("h100-80gb-mega", "H100"), ("nvidia-l4", "L4"), ("NVIDIA L4", "L4"),
    ("nvidia-tesla-t4-vws", "T4"), ("A10G", "A10G"), ("rtx6000", "RTX-PRO-6000"),
])
def test_canonical_gpu(name, canon):
    assert canonical_gpu(name) == canon


@pytest.mark.parametrize("itype,model,count", [
    ("p2.xlarge", "K80", 1), ("p2.16xlarge", "K80", 16), ("p3.2xlarge", "V100", 1),
    ("p3.16xlarge", "V100", 8), ("p3dn.24xlarge", "V100-32GB", 8), ("p4d.24xlarge", "A100-40GB", 8),
    ("p5.48xlarge", "H100", 8), ("g3.8xlarge", "M60", 2), ("g4dn.xlarge", "T4", 1),
    ("g4dn.12xlarge", "T4", 4), ("g5.2xlarge", "A10G", 1), ("g5.48xlarge", "A10G", 8),
    ("g6.xlarge", "L4", 1), ("g6.12xlarge", "L4", 4),
    ("a2-highgpu-1g", "A100-40GB", 1), ("a2-highgpu-8g", "A100-40GB", 8),
    ("a2-megagpu-16g", "A100-40GB", 16), ("a2-ultragpu-4g", "A100-80GB", 4),
    ("a3-highgpu-8g", "H100", 8), ("a3-megagpu-8g", "H100", 8), ("g2-standard-4", "L4", 1),
    ("g2-standard-24", "L4", 2), ("g2-standard-96", "L4", 8), ("g4-standard-48", "RTX-PRO-6000", 1),
    ("n1-standard-8+nvidia-tesla-v100x2", "V100", 2), ("n1-standard-4+k80", "K80", 1),
])
def test_gpu_for(itype, model, count):
    spec = gpu_for(itype)
    assert spec is not None and (spec.model, spec.count) == (model, count)
    assert spec.memory_gib and spec.memory_gib > 0


@pytest.mark.parametrize("itype", ["c5.large", "r5.16xlarge", "c3-highcpu-88", "n1-standard-4",
                                   "g4-standard-12", "inf1.xlarge"])
def test_gpu_for_none_without_gpu(itype):
    assert gpu_for(itype) is None


def test_relative_throughput_known_and_unknown():
    assert relative_throughput("nvidia-tesla-v100") == 1.0
    assert relative_throughput("H100") > relative_throughput("A100-80GB") > relative_throughput("A100-40GB")
    assert relative_throughput("T4") < relative_throughput("L4") < 1.0
    with pytest.raises(KeyError, match="no throughput prior"):
        relative_throughput("Voodoo3")


def _geomean_ratio(rows, name, base):
    models = ["bert_base_squad", "bert_large_squad", "gnmt", "resnet50", "tacotron2",
              "transformerxlbase", "transformerxllarge", "waveglow", "ssd"]
    r, b = rows[name], rows[base]
    logs = [math.log(float(r[m]) / float(b[m])) for m in models if float(r[m]) > 0 and float(b[m]) > 0]
    return math.exp(sum(logs) / len(logs))


def test_prior_matches_lambda_table(shared_data):
    """Recompute the Lambda-derived figures from the real csv: the table in the code must
    agree to the rounding used there."""
    def load(fn):
        with open(shared_data / "gpu_throughput" / fn, newline="") as f:
            return {r["name_gpu"]: r for r in csv.DictReader(f) if float(r["num_gpu"]) == 1}
    rows = load("lambda_pytorch_train_throughput_fp16.csv")
    old = load("lambda_pytorch_train_throughput_fp16_2022-07-06.csv")
    base = "LambdaCloud V100 16GB"
    assert _geomean_ratio(rows, "A100 80GB SXM4", base) == pytest.approx(LAMBDA_FP16_PRIOR["A100-80GB"], abs=0.006)
    assert _geomean_ratio(rows, "H100 80GB SXM5", base) == pytest.approx(LAMBDA_FP16_PRIOR["H100"], abs=0.006)
    assert _geomean_ratio(rows, "LambdaCloud A10", base) == pytest.approx(LAMBDA_FP16_PRIOR["A10"], abs=0.006)
    assert _geomean_ratio(rows, "RTX 6000 Ada", base) == pytest.approx(LAMBDA_FP16_PRIOR["RTX6000-ADA"], abs=0.006)
    pcie = _geomean_ratio(rows, "LambdaCloud A100 40GB PCIe", base)
    sxm_over_pcie = _geomean_ratio(old, "A100 40GB SXM4", "V100 32GB") / _geomean_ratio(old, "A100 40GB PCIe", "V100 32GB")
    assert pcie * sxm_over_pcie == pytest.approx(LAMBDA_FP16_PRIOR["A100-40GB"], abs=0.02)
