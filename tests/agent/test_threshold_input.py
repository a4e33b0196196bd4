"""Thresholds: each has a unit and range, `gpudiag thresholds` states them, bad values are
refused with one line and exit 2."""

from __future__ import annotations

import sys

import pytest

from gpudiag.analyzers.model.thresholds import Thresholds
from tests.conftest import assert_one_line_error


def test_every_default_lies_in_its_range():
    # a new threshold outside 0..1 must say its unit in analyzers/model/thresholds.py UNITS
    for name, value in Thresholds().to_dict().items():
        assert Thresholds.parse(name, value) == value, name


def test_thresholds_command_states_unit_and_range(cli):
    res = cli("thresholds")
    assert res.returncode == 0
    listing = res.stdout
    assert "data_wait_warn = 0.1  (a share from 0 to 1)" in listing
    assert "min_loop_samples = 150  (a count, a whole number from 0)" in listing
    assert "min_free_cores = 0.5  (a number of CPU cores from 0)" in listing
    from gpudiag.analyzers.model.thresholds import RANGES

    for name in Thresholds.names():
        line = next(ln for ln in listing.splitlines() if ln.startswith(f"{name} = "))
        assert f"({RANGES[Thresholds.unit(name)]})" in line


@pytest.mark.parametrize(
    "setting,words",
    [
        ("data_wait_warn=5", ("data_wait_warn", "a share from 0 to 1", "'5'")),
        ("data_wait_warn=-0.1", ("a share from 0 to 1",)),
        ("checkpoint_warn=ten", ("checkpoint_warn", "a share from 0 to 1", "'ten'")),
        ("min_loop_samples=1.5", ("min_loop_samples", "whole number", "'1.5'")),
        ("min_free_cores=-2", ("min_free_cores", "CPU cores")),
        ("data_wait_warn=nan", ("a share from 0 to 1",)),
    ],
)
def test_set_refuses_values_out_of_range(cli, setting, words):
    res = cli("run", "--set", setting, "--", sys.executable, "-c", "pass")
    assert_one_line_error(res, "--set", *words)


def test_duration_thresholds_must_be_positive():
    assert Thresholds.unit("save_interval_s") == "seconds"
    with pytest.raises(ValueError, match="more than 0"):
        Thresholds.parse("save_interval_s", 0)
    assert Thresholds.parse("save_interval_s", "2.5") == 2.5


@pytest.mark.parametrize(
    "toml,words",
    [
        ("[thresholds]\ndata_wait_warn = 20\n", ("cfg.toml", "data_wait_warn", "0 to 1")),
        ("[thresholds]\nmin_loop_samples = 99.5\n", ("cfg.toml", "whole number")),
        ("[thresholds]\ngil_wait_warn = true\n", ("cfg.toml", "gil_wait_warn")),
    ],
)
def test_config_file_values_are_checked_too(cli, tmp_path, toml, words):
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(toml)
    res = cli("run", "--config", str(cfg), "--", sys.executable, "-c", "pass")
    assert_one_line_error(res, *words)
