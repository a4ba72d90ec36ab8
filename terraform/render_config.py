"""Turn ``terraform output -json`` of terraform/aws or terraform/gcp into the daemon's config TOML.

Design: each module exposes one output, ``daemon_settings``, holding every value
``provision run`` needs (its ``cloud`` key names the module; outputs of terraform/aws from
before that key are AWS); the module writes the same settings onto the daemon host through
``templates/daemon-config.toml.tftpl``. This script renders them for a daemon run elsewhere (a
laptop, a test against a moto server: ``--endpoint-url``), so both paths give one
configuration (tests/terraform compares them field by field through
:func:`provisioner.config.parse_settings`).

Rule for callers: feed it the whole ``terraform output -json`` document; it validates the
result with the daemon's own settings model and refuses to print a config the daemon would
reject.

Usage::

    terraform -chdir=terraform/aws output -json | python terraform/render_config.py - > spotring.toml
    terraform -chdir=terraform/gcp output -json | python terraform/render_config.py - > spotring.toml
    python terraform/render_config.py outputs.json --endpoint-url http://127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

_COMMON = ("job_id", "job_file", "max_workers", "coordinator_host", "coordinator_port",
           "token_path", "state_path")
#: What ``daemon_settings`` must hold, per module.
REQUIRED = {
    "aws": _COMMON + ("region", "price_regions", "launch_template_id", "queue_url", "subnets"),
    "gcp": _COMMON + ("project", "zones", "network", "subnetwork", "source_image", "boot_disk_gb",
                      "service_account", "startup_script"),
}


class RenderError(ValueError):
    """The outputs do not hold what the daemon needs; the message names the field."""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise RenderError(f"cannot write {value!r} as a TOML value")


def settings_from_outputs(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``daemon_settings`` map out of ``terraform output -json``.

    Raises RenderError when the output or one of its fields is missing.
    """
    try:
        settings = outputs["daemon_settings"]["value"]
    except (KeyError, TypeError):
        raise RenderError("terraform output has no daemon_settings: run `terraform output -json` "
                          "in an applied terraform/aws or terraform/gcp") from None
    cloud = settings.get("cloud", "aws")
    if cloud not in REQUIRED:
        raise RenderError(f"daemon_settings.cloud = {cloud!r}: expected one of "
                          f"{', '.join(sorted(REQUIRED))}")
    missing = [k for k in REQUIRED[cloud] if k not in settings]
    if missing:
        raise RenderError(f"daemon_settings lacks {', '.join(missing)}: re-apply terraform/{cloud} "
                          f"with this version of the module")
    return dict(settings, cloud=cloud)


def render(outputs: Mapping[str, Any], *, endpoint_url: str | None = None,
           state_path: str | None = None, token_path: str | None = None,
           coordinator: tuple[str, int] | None = None,
           wheel: str | None = None) -> dict[str, dict[str, Any]]:
    """The daemon configuration as nested dicts (TOML tables), from terraform outputs.

    ``endpoint_url`` points the driver at an emulator (``[aws] endpoint_url`` or ``[gcp]
    api_endpoint``; on AWS the snapshots' S3 too, ``[snapshot] endpoint_url``); ``state_path`` overrides where the daemon keeps its SQLite state;
    ``token_path`` where it reads the ring token (the daemon runs the trainer's coordinator with
    it); ``coordinator`` the (host, port) the coordinator binds (for a daemon run off the host,
    e.g. in tests). ``[cloud] artifacts`` comes from the outputs; ``wheel`` is the spotring
    wheel this daemon runs (``[cloud] wheel``: the daemon host's own copy means nothing
    elsewhere, so it is never taken from the outputs; unset, a daemon run from a checkout
    builds one). ``[snapshot]`` (``url``, ``direct``) comes from the outputs' ``snapshot_url``.
    Raises RenderError on incomplete outputs.
    """
    s = settings_from_outputs(outputs)
    cloud = s["cloud"]
    if cloud == "aws":
        section: dict[str, Any] = {"region": s["region"],
                                   "launch_template_id": s["launch_template_id"],
                                   "queue_url": s["queue_url"], "subnets": dict(s["subnets"])}
        source: dict[str, Any] = {"kind": "aws", "regions": list(s["price_regions"])}
        endpoint_key = "endpoint_url"
    else:
        section = {"project": s["project"], "zones": list(s["zones"]), "network": s["network"],
                   "subnetwork": s["subnetwork"], "source_image": s["source_image"],
                   "boot_disk_gb": int(s["boot_disk_gb"]),
                   "service_account": s["service_account"],
                   "startup_script": s["startup_script"]}
        source = {"kind": "gcp"}
        endpoint_key = "api_endpoint"
    if endpoint_url:
        section[endpoint_key] = endpoint_url
    return {
        "job": {"id": s["job_id"], "job_file": s["job_file"]},
        "fleet": {"max_size": int(s["max_workers"])},
        "source": source,
        "cloud": {"driver": cloud, **({"artifacts": s["artifacts"]} if s.get("artifacts") else {}),
                  **({"wheel": wheel} if wheel else {})},
        cloud: section,
        "daemon": {"state_path": state_path or s["state_path"],
                   "coordinator_host": coordinator[0] if coordinator else s["coordinator_host"],
                   "coordinator_port": int(coordinator[1] if coordinator
                                           else s["coordinator_port"]),
                   "token_path": token_path or s["token_path"]},
        # the ring's snapshots in the module's bucket, where its workers may put them while
        # the daemon is away (the modules' snapshots.tf grants it); older outputs: none
        **({"snapshot": {"url": s["snapshot_url"], "direct": True,
                         # a moto server serves S3 at the same endpoint; a GCP emulator's
                         # endpoint is Compute's, not Cloud Storage's
                         **({"endpoint_url": endpoint_url}
                            if endpoint_url and cloud == "aws" else {})}}
           if s.get("snapshot_url") else {}),
    }


def to_toml(config: Mapping[str, Mapping[str, Any]]) -> str:
    """Write two-level tables (``[aws]``, ``[aws.subnets]``) as TOML text."""
    lines = ["# spotring daemon configuration rendered from `terraform output -json`"]
    for table, values in config.items():
        lines += ["", f"[{table}]"]
        subtables = {k: v for k, v in values.items() if isinstance(v, Mapping)}
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items() if k not in subtables]
        for name, sub in subtables.items():
            lines += ["", f"[{table}.{name}]"]
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in sub.items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outputs", help="file with `terraform output -json`, or - for stdin")
    parser.add_argument("--endpoint-url", default=None,
                        help="AWS endpoint (e.g. a moto server) or GCP Compute API endpoint")
    parser.add_argument("--state-path", default=None, help="daemon state file")
    parser.add_argument("--token-path", default=None, help="ring token file the daemon reads")
    parser.add_argument("--wheel", default=None, help="the spotring wheel this daemon runs "
                        "([cloud] wheel; default: built from the checkout it runs from)")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.outputs == "-" else Path(args.outputs).read_text()
        outputs = json.loads(text)
        config = render(outputs, endpoint_url=args.endpoint_url, state_path=args.state_path,
                        token_path=args.token_path, wheel=args.wheel)
    except (OSError, json.JSONDecodeError, RenderError) as exc:
        sys.stderr.write(f"render_config: {args.outputs}: {exc}\n")
        return 2
    try:  # refuse a config the daemon would reject (when spotring is importable)
        from provisioner.config import parse_settings
        from provisioner.errors import ConfigError
    except ImportError:
        pass
    else:
        try:
            parse_settings(config, origin=args.outputs)
        except ConfigError as exc:
            sys.stderr.write(f"render_config: {exc}\n")
            return 2
    sys.stdout.write(to_toml(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
