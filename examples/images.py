"""Image classification as the torchvision reference ``train.py`` writes it, run as a spotring job.

Design: a small ResNet-style CNN with BatchNorm on scikit-learn's digits (8x8 images shipped
inside scikit-learn, so it trains on a CPU in CI), with what the torchvision classification
reference adds around the model, each in the place the job gives it:

* **mixup** in the ``collate_fn`` (targets become probability vectors), and **label
  smoothing** in the loss (``cross_entropy(..., label_smoothing=0.1)``), so the batch stays
  ``(images, targets)`` and ``loss_fn`` stays a plain loss;
* an **EMA** of the weights (``torch.optim.swa_utils.AveragedModel``, buffers included) in
  ``extra_state``, updated in ``after_step`` on every member (it travels to joiners, goes into
  snapshots and is covered by the members' digests); ``evaluate`` reports both accuracies;
* a **per-epoch schedule** (cosine over the epochs: ``scheduler_every="epoch"``);
* SGD with momentum and weight decay, as the reference's defaults.

Knobs (environment, for tests and benchmarks): ``IMAGES_EPOCHS`` (default 6),
``IMAGES_BATCH`` (global batch, default 64), ``IMAGES_SLEEP_MS`` (each training forward
sleeps this long: tests pace a ring with it).

Run it in a ring::

    python -m trainer coordinator --port 29400 --token-file token &
    python -m trainer worker --coordinator 127.0.0.1:29400 --token-file token \
        --job examples/images.py
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import Dataset

from trainer.job import Job, StepContext

CLASSES = 10


class Digits(Dataset):
    """``(image (1, 8, 8) in [0, 1], label)`` of the digits split ``part`` (80/20, fixed)."""

    def __init__(self, part: str) -> None:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        d = load_digits()
        tr, te = train_test_split(range(len(d.target)), test_size=0.2, random_state=0,
                                  stratify=d.target)
        idx = tr if part == "train" else te
        self.x = torch.tensor(d.images[idx], dtype=torch.float32).unsqueeze(1) / 16.0
        self.y = torch.tensor(d.target[idx], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Residual(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(ch, ch, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(ch), nn.ReLU(),
                                  nn.Conv2d(ch, ch, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.body(x))


class SmallResNet(nn.Module):
    def __init__(self, ch: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, ch, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(ch), nn.ReLU())
        self.stages = nn.Sequential(Residual(ch), nn.MaxPool2d(2), Residual(ch))
        self.head = nn.Linear(ch, CLASSES)
        self.sleep_s = float(os.environ.get("IMAGES_SLEEP_MS", "0")) / 1000

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.sleep_s:
            time.sleep(self.sleep_s)
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))


def mixup_collate(samples: list[tuple[torch.Tensor, torch.Tensor]], alpha: float = 0.2
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's ``RandomMixup`` as a ``collate_fn``: the batch mixed with itself rolled
    by one, with a Beta(alpha, alpha) weight; targets become probability vectors."""
    x = torch.stack([s[0] for s in samples])
    y = F.one_hot(torch.stack([s[1] for s in samples]), CLASSES).float()
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    return lam * x + (1 - lam) * x.roll(1, 0), lam * y + (1 - lam) * y.roll(1, 0)


def smoothed_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target, label_smoothing=0.1)


def accuracy(model: nn.Module, data: Digits) -> float:
    dev = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        pred = model(data.x.to(dev)).argmax(1).cpu()
    return float((pred == data.y).float().mean())


def make_job(seed: int) -> Job:
    """The image-classification job; every worker calls this with the same ``seed``."""
    torch.manual_seed(seed)
    train, test = Digits("train"), Digits("test")
    epochs = int(os.environ.get("IMAGES_EPOCHS", "6"))
    model = SmallResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                          nesterov=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)

    def after_step(ctx: StepContext) -> None:
        ema.update_parameters(ctx.model)  # every member, from the committed weights

    def evaluate(m: nn.Module) -> dict[str, Any]:
        return {"accuracy": accuracy(m, test), "ema_accuracy": accuracy(ema.module, test)}

    return Job(model=model, optimizer=opt, loss_fn=smoothed_ce, train_set=train,
               collate_fn=mixup_collate, global_batch=int(os.environ.get("IMAGES_BATCH", "64")),
               epochs=epochs, scheduler=sched, scheduler_every="epoch",
               extra_state={"ema": ema}, after_step=after_step, evaluate=evaluate,
               loader_workers=0, mode="ring")
