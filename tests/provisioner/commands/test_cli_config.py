import pytest

from provisioner.cli import main
from provisioner.config import load_settings
from provisioner.errors import ConfigError


def test_missing_config_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml")


def test_unknown_key_and_bad_value_name_the_field(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[fleet]\nmax_size = 0\nmax_sise = 3\n')
    with pytest.raises(ConfigError) as exc:
        load_settings(p)
    msg = str(exc.value)
    assert "fleet.max_size" in msg and "fleet.max_sise: unknown setting" in msg


def test_no_config_gives_local_defaults():
    s = load_settings(None)
    assert s.cloud.driver == "local" and s.source.kind == "trace"


def test_cli_without_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "provision" in capsys.readouterr().out
