"""Which run a command means, and where that run's files are: ``provision run --detach``,
``logs`` and ``down`` agree on one answer.

Design: a run is a work directory (a local run: ``WORKDIR/state.sqlite``, ``WORKDIR/.lock``,
``WORKDIR/daemon.log``, its workers' logs in ``WORKDIR/cloud/logs/``) or a cloud state file
(``STATE_PATH``, ``STATE_PATH.lock``, ``STATE_PATH.log``, ``STATE_PATH.report/``).
:func:`resolve` turns what the user typed into a :class:`Target`: the one way ``provision
status``, ``logs``, ``down``, ``stop`` and ``revoke`` name a run (``RUN``): ``--config FILE`` (its ``daemon.state_path``,
or its ``local.state_dir`` for a local config); else a work directory; else a state file;
else a run of ``provision list`` by pid, ``--name`` or run id; else a stopped run by its
``--name``; else, with nothing typed, ``./spotring-run`` when it exists, or the one run
this machine has.

Rule: the log, lock and default report names are decided here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import UserError

DEFAULT_WORKDIR = "spotring-run"
LOG_NAME = "daemon.log"


@dataclass(frozen=True)
class Target:
    """The files of one run."""

    driver: str  # "local", or the cloud driver's name
    root: Path  # the work directory, or the state file's folder
    state: Path
    lock: Path
    log: Path
    config: str | None = None

    @property
    def local(self) -> bool:
        return self.driver == "local"

    @property
    def report(self) -> Path:
        """The default report folder: ``WORKDIR/report``, or ``STATE_PATH.report``."""
        if self.local:
            return self.root / "report"
        return self.state.with_name(self.state.name + ".report")

    @property
    def workers_logs(self) -> Path:
        """The local workers' logs (``<instance id>.log``)."""
        return self.root / "cloud" / "logs"

    @property
    def what(self) -> str:
        """How messages name it: the flag that selects it."""
        return f"--workdir {self.root}" if self.local else f"daemon.state_path {self.state}"


def local_target(workdir: str | Path, config: str | None = None) -> Target:
    root = Path(workdir).expanduser().resolve()
    return Target("local", root, root / "state.sqlite", root / ".lock", root / LOG_NAME, config)


def cloud_target(driver: str, state_path: str | Path, config: str | None = None) -> Target:
    state = Path(state_path).expanduser().resolve()
    return Target(driver, state.parent, state, state.with_name(state.name + ".lock"),
                  state.with_name(state.name + ".log"), config)


def from_settings(settings: object, config: str | None, workdir: str | None = None) -> Target:
    """The target of a run started with these settings (and ``--workdir``)."""
    driver = settings.cloud.driver  # type: ignore[attr-defined]
    if driver == "local":
        return local_target(workdir or settings.local.state_dir, config)  # type: ignore[attr-defined]
    return cloud_target(driver, settings.daemon.state_path, config)  # type: ignore[attr-defined]


def resolve(ref: str | None, config: str | None) -> Target:
    """What the user named (see the module docstring). Raises UserError naming the fix."""
    from provisioner.daemon.run import registry

    if config is not None:
        from provisioner.config import load_settings

        return from_settings(load_settings(config), config, ref)
    if ref is not None:
        path = Path(ref).expanduser()
        if path.is_dir():
            return local_target(path)
        if path.is_file():
            return of_state(path)
        entry = registry.find(ref)
        if entry is not None:
            return of_entry(entry)
        known = registry.named(ref)
        if known is not None:
            if known["driver"] == "local":
                return local_target(known["workdir"], known.get("config"))
            return cloud_target(known["driver"], known["state"], known.get("config"))
        raise UserError(f"{ref}: no run by that name, id or pid, and no work directory or "
                        f"state file there; give a run of `provision list`, its --name, its "
                        f"--workdir or state file, or --config FILE for a cloud run")
    if Path(DEFAULT_WORKDIR).is_dir():
        return local_target(DEFAULT_WORKDIR)
    runs = registry.entries()
    if len(runs) == 1:
        return of_entry(runs[0])
    if not runs:
        raise UserError(f"no ./{DEFAULT_WORKDIR} here and no run on this machine; name one: "
                        f"its --name, work directory or state file (or --config FILE)")
    raise UserError(f"{len(runs)} runs on this machine (" + ", ".join(
        e.name or e.run_id for e in runs) + "); name one (see `provision list`)")


def of_state(path: Path) -> Target:
    """The run a state file belongs to: a local run's work directory when it is one's
    ``state.sqlite``, else a cloud run's state file (its driver from the state)."""
    path = path.expanduser().resolve()
    if path.name == "state.sqlite" and ((path.parent / ".lock").exists()
                                        or (path.parent / "cloud").is_dir()):
        return local_target(path.parent)
    from provisioner.daemon.state import State

    st = State.read_only(path)
    try:
        driver = str((st.get_meta("job") or {}).get("driver") or "cloud")
    finally:
        st.close()
    if driver == "local":
        return Target("local", path.parent, path, path.parent / ".lock",
                      path.parent / LOG_NAME)
    return cloud_target(driver, path)


def of_entry(entry: object) -> Target:
    """The target of a :class:`~provisioner.daemon.run.registry.Entry`."""
    e = entry
    if e.driver == "local":  # type: ignore[attr-defined]
        return local_target(e.workdir, e.config)  # type: ignore[attr-defined]
    return cloud_target(e.driver, e.state, e.config)  # type: ignore[attr-defined]
