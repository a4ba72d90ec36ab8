"""A ResNet-50-sized CNN on synthetic images: the benchmarks' large vision job (plain torch).

Design. ResNet-50 as torchvision builds it (bottleneck blocks [3, 4, 6, 3], widths 64 to 512
times 4, BatchNorm after every convolution, stride on the 3x3 convolution, a 1000-way linear
head: 25,557,032 parameters), written out here because torchvision is not installable on
this project's machines. The data are synthetic: ``BENCH_SAMPLES`` uint8 images of
``3 x RESNET_IMAGE x RESNET_IMAGE`` and random labels, generated once from the seed and held
in a ``TensorDataset`` (the worker indexes it straight into pinned memory; no loader
processes). The model converts and normalises the uint8 batch on its device, as a GPU
input pipeline does, so the host moves a quarter of the bytes a float batch would need.
SGD with momentum 0.9 and weight decay 1e-4, cross-entropy. Nothing is learnt (the labels
are random): the job is for throughput, and ``evaluate`` is left out.

Knobs (environment): ``BENCH_BATCH`` (global batch, default 256), ``BENCH_EPOCHS`` (default
1000: a benchmark stops it), ``BENCH_SAMPLES`` (default 1024), ``BENCH_PRECISION``
(``fp32``, ``bf16`` or ``fp16``; default fp32), ``RESNET_IMAGE`` (side, default 224),
``RESNET_CHANNELS_LAST=1`` (the channels-last memory format, faster for bf16 convolutions
on recent GPUs), and ``BENCH_TINY=1``: a smoke-test size (blocks [1, 1, 1, 1], widths
divided by 8, 32x32 images, 10 classes, 128 samples, batch 32) that runs on a CPU in
seconds.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer.job import Job

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (with the stride), 1x1 expand (x4), each with BatchNorm; a projected
    shortcut when the shape changes; the last BatchNorm's scale starts at zero."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        nn.init.zeros_(self.bn3.weight)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or inplanes != out:
            self.down = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + idt)


class ResNet(nn.Module):
    """ResNet with bottleneck blocks; takes uint8 images and normalises them itself."""

    def __init__(self, blocks: tuple[int, ...] = (3, 4, 6, 3), width: int = 64,
                 classes: int = 1000) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1) * 255)
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        layers, inplanes = [], width
        for i, n in enumerate(blocks):
            planes = width * 2**i
            for k in range(n):
                layers.append(Bottleneck(inplanes, planes, stride=2 if (k == 0 and i > 0) else 1))
                inplanes = planes * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(inplanes, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() - self.mean) / self.std
        if x.is_cuda and os.environ.get("RESNET_CHANNELS_LAST") == "1":
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def make_job(seed: int) -> Job:
    """The synthetic ResNet job; every worker calls this with the same ``seed``."""
    tiny = os.environ.get("BENCH_TINY") == "1"
    torch.manual_seed(seed)
    if tiny:
        model = ResNet((1, 1, 1, 1), width=8, classes=10)
        side, classes, samples, batch = 32, 10, 128, 32
    else:
        model = ResNet()
        side, classes, samples, batch = 224, 1000, 1024, 256
    side = int(os.environ.get("RESNET_IMAGE", side))
    samples = int(os.environ.get("BENCH_SAMPLES", samples))
    if os.environ.get("RESNET_CHANNELS_LAST") == "1":
        model = model.to(memory_format=torch.channels_last)
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (samples, 3, side, side), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, classes, (samples,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    return Job(model=model, optimizer=opt, loss_fn=nn.functional.cross_entropy,
               train_set=TensorDataset(images, labels),
               global_batch=int(os.environ.get("BENCH_BATCH", batch)),
               epochs=int(os.environ.get("BENCH_EPOCHS", "1000")),
               precision=os.environ.get("BENCH_PRECISION", "fp32"))
