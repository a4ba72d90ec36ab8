"""Cloud drivers: one file per cloud implementing :class:`provisioner.drivers.base.CloudDriver`."""
