"""Cloud drivers: one file per cloud implementing :class:`provisioner.drivers.base.CloudDriver`.

Design: :data:`DRIVERS` maps ``[cloud] driver`` to the function that builds a cloud's driver
from validated settings (SDKs are imported only when that cloud is used). The local driver
is not in it: its "instances" are worker processes whose command line the local run builds
(:mod:`provisioner.daemon.run.local`).

Rule: a new cloud adds one file and one entry here; the contract test
(tests/provisioner/drivers/test_contract.py) runs against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.config import Settings
    from provisioner.drivers.base import CloudDriver


def _aws(settings: "Settings") -> "CloudDriver":
    from provisioner.drivers.aws import from_settings

    return from_settings(settings.aws)


def _gcp(settings: "Settings") -> "CloudDriver":
    from provisioner.drivers.gcp import from_settings

    return from_settings(settings.gcp)


DRIVERS: dict[str, Callable[["Settings"], "CloudDriver"]] = {"aws": _aws, "gcp": _gcp}
