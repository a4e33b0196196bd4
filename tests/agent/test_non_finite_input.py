"""Numbers from outside go through one parser that refuses non-finite values: the gate's limits
and its minimum effect in any spelling, the hooks' datagrams."""

from __future__ import annotations

import os

import pytest

from gpudiag.agent.base.errors import UsageError


@pytest.mark.parametrize(
    "line",
    [
        'fail = "nan%"',
        'fail = "NaN %"',
        'warn = "inf%"',
        'fail = "-Infinity%"',
        'fail = "1e400%"',
        'fail = "nan"',
    ],
)
def test_gate_limits_refuse_non_finite_in_any_spelling(tmp_path, line):
    """`fail = "nan%"` passed a -90% regression."""
    from gpudiag.agent.commands.gate import load_gate_config

    cfg = tmp_path / "gate.toml"
    cfg.write_text(f"[gate.metrics.steps_per_second]\n{line}\n")
    with pytest.raises(UsageError, match="finite|percentage"):
        load_gate_config(str(cfg))


@pytest.mark.parametrize("value", ['"inf"', '"nan"', '"-inf"', '"1e999"', "true"])
def test_gate_min_effect_refuses_non_finite(tmp_path, value):
    """`min_effect = "inf"` made nothing fail."""
    from gpudiag.agent.commands.gate import load_gate_config

    cfg = tmp_path / "gate.toml"
    cfg.write_text(f"[gate]\nmin_effect = {value}\n")
    with pytest.raises(UsageError, match="min_effect"):
        load_gate_config(str(cfg))


BAD_DATAGRAMS = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"steps": [[1e400, 1, 1, 1, 1, 1, 1, 1, 1]]}',
    b'{"steps": [[NaN, 1, 1, 1, 1, 1, 1, 1, 1]]}',
    b'{"steps": [[1.0, 1e400, 1, 1, 1, 1, 1, 1, 1]]}',
    b'{"steps": [[1.0, ' + b"9" * 400 + b", 1, 1, 1, 1, 1, 1, 1]]}",
    b'{"mem": {"allocated": ' + b"9" * 400 + b"}}",
    b'{"sites": {"a": ' + b"9" * 400 + b"}}",
    b'{"pid": 7, "dist": {"env": {"rank": "\xc2\xb2"}, "steps": [[1e300, 1, 1, 1]]}}',
    b'{"pid": 7, "dist": {"t": 1e300, "ops": {"x": [1, 2]}}}',
    b'{"capture": {"t0": 1e400, "steps": []}}',
    b'{"capture": {"steps": [' + b"[" * 5000 + b"]" * 5000 + b"]}}",
]


@pytest.mark.parametrize("data", BAD_DATAGRAMS, ids=range(len(BAD_DATAGRAMS)))
def test_datagram_parser_never_raises(data):
    """The hooks' parser raised on deep nesting, 1e400/NaN times or a rank '²'."""
    from gpudiag.probes.dist.collectives import RankLabels
    from gpudiag.probes.inprocess.channel import decode_datagram, parse_message

    labels = RankLabels()
    labels.enabled = True
    msg = decode_datagram(data)
    if msg is not None:
        for s in labels.tag(msg, parse_message(msg)):
            assert all(v == v and abs(v) != float("inf") for v in s.values.values())


def test_one_bad_datagram_does_not_stop_the_hooks_probe(tmp_path):
    """One bad datagram raised out of sample(): the hooks probe stopped for the run."""
    import socket

    from gpudiag.probes.base import Target
    from gpudiag.probes.inprocess.channel import HookProbe

    probe = HookProbe(str(tmp_path / "ch.sock"))
    assert probe.open(Target(os.getpid())).available
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        good = b'{"sites": {"x.py:1": 3}}'
        for data in (good, b'{"pid": 1, "dist": {"env": {"rank": "\xc2\xb2"}}}', good):
            s.sendto(data, probe.path)
        probe.labels.enabled = True
        got = probe.sample()
        assert [x.labels.get("kind") for x in got] == ["sync_site", "sync_site"]
    finally:
        probe.close()
