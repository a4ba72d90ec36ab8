"""The ring token in both modules: an ephemeral input, stored write-only in the cloud's secret
store (never in the Terraform state), never in user data, metadata, outputs or logs, and
written on each VM into a mode 0600 file of the service user, in place at once or not at all.

Read with python-hcl2 and from the templates' text; terraform/aws/tests/module.tftest.hcl and
test_e2e_moto.py check the same on a planned and an applied module (the token's value absent
from user data, outputs and state).
"""

from __future__ import annotations

import re

import pytest

from tests.terraform.conftest import TF_ROOT
from tests.terraform.hcl_blocks import locals_, named_blocks, resources, walk

pytestmark = pytest.mark.terraform

MODULES = ("aws", "gcp")
#: The one place each module puts the token: a write-only attribute of its secret store.
STORE = {"aws": ("aws_ssm_parameter", "ring_token", "value_wo"),
         "gcp": ("google_secret_manager_secret_version", "ring_token", "secret_data_wo")}
#: Attributes of the token's resources that may be referenced: names, never a value.
NAMES = {"name", "arn", "id", "secret_id"}
#: The scripts that fetch the token on a VM.
BOOTSTRAP = {"aws": ("daemon-user-data.sh.tftpl", "worker-user-data.sh.tftpl"),
             "gcp": ("daemon-startup.sh.tftpl", "worker-startup.sh.tftpl")}
TOKEN_VAR = re.compile(r"\bvar\.ring_token\b(?!_)")


@pytest.mark.parametrize("module", MODULES)
def test_the_token_input_is_ephemeral_and_sensitive(module: str) -> None:
    token = named_blocks(module, "variable")["ring_token"]
    assert token.get("ephemeral") is True and token.get("sensitive") is True
    assert "default" not in token  # from TF_VAR_ring_token, never from a file


@pytest.mark.parametrize("module", MODULES)
def test_the_token_goes_only_into_the_write_only_attribute(module: str) -> None:
    rtype, name, attribute = STORE[module]
    uses = [(key, path) for key, body in resources(module).items() for path, value in walk(body)
            if isinstance(value, str) and TOKEN_VAR.search(value)]
    assert uses == [((rtype, name), (attribute,))]
    assert resources(module)[(rtype, name)][attribute] == "${var.ring_token}"
    elsewhere = [(k, p) for k, body in [("locals", locals_(module)),
                                        ("outputs", named_blocks(module, "output"))]
                 for p, v in walk(body) if isinstance(v, str) and TOKEN_VAR.search(v)]
    assert not elsewhere


@pytest.mark.parametrize("module", MODULES)
def test_nothing_reads_the_stored_token_back(module: str) -> None:
    """Outputs, user data, metadata and configs name the secret, never its value."""
    blocks = [("resource", resources(module)), ("locals", locals_(module)),
              ("output", named_blocks(module, "output"))]
    for kind, body in blocks:
        for path, value in walk(body):
            if not isinstance(value, str):
                continue
            for attr in re.findall(r"\bring_token\.(\w+)", value):
                assert attr in NAMES, f"{kind} {path} reads ring_token.{attr}"


@pytest.mark.parametrize("module", MODULES)
def test_no_template_is_given_the_token(module: str) -> None:
    for template in (TF_ROOT / module / "templates").iterdir():
        names = set(re.findall(r"\$\{\s*([a-z_]+)", template.read_text()))
        assert not names & {"ring_token", "token", "secret_data", "token_value"}, template.name


#: The worker boot's log shipper: every line but those holding the token (grep -v, as root).
SHIP_FILTER = "if [ -s '${token_path}' ]; then grep -avF -f '${token_path}' || true; else cat; fi"


@pytest.mark.parametrize("module", MODULES)
def test_vms_write_the_token_0600_atomically_and_never_log_it(module: str) -> None:
    for name in BOOTSTRAP[module]:
        text = (TF_ROOT / module / "templates" / name).read_text()
        code = [line.strip() for line in text.splitlines() if not line.lstrip().startswith("#")]
        assert not [c for c in code if re.match(r"set\s+-\w*x", c)], f"{name}: set -x logs secrets"
        steps = ["umask 077",
                 "token_tmp=$(mktemp /etc/spotring/.ring-token.XXXXXX)",  # created 0600
                 "> \"$token_tmp\"",                                      # fetched into it
                 "chown spotring:spotring \"$token_tmp\"",                # the service user's
                 "mv -f \"$token_tmp\" '${token_path}'"]                  # in place at once
        at = [next((i for i, c in enumerate(code) if step in c), -1) for step in steps]
        assert -1 not in at and at == sorted(at), f"{name}: token steps {dict(zip(steps, at))}"
        # The token file is touched by nothing else (no chmod to a wider mode, no cat/echo);
        # the worker passes its path, not its content; a failed fetch removes its file; the
        # log shipper reads it only to drop every line holding it (test_worker_boot.py).
        others = [c for c in code if "token_path" in c or "token_tmp" in c]
        allowed = [c for c in others
                   if any(s in c for s in steps[1:]) or "--token-file ${token_path}" in c
                   or c == 'rm -f "$token_tmp"' or c == SHIP_FILTER]
        assert others == allowed, f"{name}: {sorted(set(others) - set(allowed))}"
