"""What a job asks of the pipeline mode: virtual workers of k stages, and how they run.

Design. A job trains as HetPipe virtual workers with ``Job(mode="pipeline",
pipeline=PipelineSettings(...))`` (or :func:`trainer.pipeline.virtual_workers`, which also
times the model's layers during the worker's profiling steps, before it joins). The model
must be a ``torch.nn.Sequential``: its children are the layers the layout cuts into stages.

Rule for callers: every worker of a job builds the same settings (they are part of the job).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.pipeline.partition import SCHEDULES


@dataclass(frozen=True)
class PipelineSettings:
    """``stages``: k, the stages of one virtual worker (fewer when fewer members are up);
    ``micro_batch``: the fixed micro-batch size (the number of micro-batches a virtual worker
    takes per wave carries its share of the global batch); ``schedule``: ``1f1b`` (at most
    ``k - j`` micro-batches' activations at stage ``j``) or ``gpipe``; ``staleness``: the WSP
    bound D (0: synchronous, the global batch's gradient); ``memory_bytes``: each member's
    memory for its stage (None: a GPU's total memory, no limit on a CPU); ``fixed_shapes``:
    a stage's output shape depends only on its number of samples (False: a shape header
    before every tensor); ``layer_seconds``: per-layer cost per sample, when declared
    instead of measured; ``keep_within``: the layout's hysteresis (a re-forming keeps the
    previous slots and boundaries while their throughput is within this factor of the fresh
    optimum's: lower it where members' measured speeds are noisy, e.g. a shared machine,
    so a kill does not also move the stages)."""

    stages: int = 2
    micro_batch: int = 8
    schedule: str = "1f1b"
    staleness: int = 0
    memory_bytes: float | None = None
    fixed_shapes: bool = True
    layer_seconds: tuple[float, ...] | None = None
    keep_within: float = 0.9

    def __post_init__(self) -> None:
        if not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"stages={self.stages!r}: expected an int >= 1")
        if not isinstance(self.micro_batch, int) or self.micro_batch < 1:
            raise ValueError(f"micro_batch={self.micro_batch!r}: expected an int >= 1")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: expected one of {SCHEDULES}")
        if not isinstance(self.staleness, int) or self.staleness < 0:
            raise ValueError(f"staleness={self.staleness!r}: expected an int >= 0")
        if not isinstance(self.keep_within, (int, float)) or not 0 < self.keep_within <= 1:
            raise ValueError(f"keep_within={self.keep_within!r}: expected a number in (0, 1]")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError("memory_bytes: expected a positive number of bytes or None")
