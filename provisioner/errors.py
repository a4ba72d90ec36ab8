"""Exceptions of the provisioner package.

Design: drivers translate SDK errors (botocore ``ClientError``, google ``GoogleAPICallError``)
into these at the edge, so the daemon handles one family whatever the cloud. The CLI maps
:class:`UserError` subclasses to one clear line on stderr and exit code 2.
"""

from __future__ import annotations


class ProvisionerError(Exception):
    """Base class of every error raised by the provisioner package."""


class UserError(ProvisionerError):
    """Bad input the user can fix: printed as one line, exit code 2, no traceback."""


class ConfigError(UserError):
    """The configuration file is missing, unreadable or invalid; names the field and the fix."""


class CredentialsError(UserError):
    """A cloud driver has no usable credentials; says how to configure them."""


class InfeasibleError(UserError):
    """The optimiser cannot meet the configuration; names the binding constraint."""


class DriverError(ProvisionerError):
    """A cloud call failed for a reason other than capacity (after botocore's retries)."""


class CapacityError(DriverError):
    """The cloud has no capacity for an offering now (e.g. AWS InsufficientInstanceCapacity)."""

    def __init__(self, offering_key: str, message: str) -> None:
        self.offering_key = offering_key
        super().__init__(f"{offering_key}: {message}")
