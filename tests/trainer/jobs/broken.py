"""Test job that fails to import (a missing module): the worker must stop before joining."""

import spotring_no_such_module  # noqa: F401
