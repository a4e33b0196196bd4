"""Secrets on the job's command line never reach a report, a recording or gpudiag's lines."""

from __future__ import annotations

import gzip

import pytest

from gpudiag.agent.output.recording import Recorder, open_recording
from gpudiag.text.redact import (
    MASK,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_lines,
    redact_text,
)

SECRET = "sk-live-0123456789abcdefSECRET"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--api-key", "abc123"], ["--api-key", MASK]),
        (["--api-key=abc123"], ["--api-key=" + MASK]),
        (["--token", "t", "--password=p"], ["--token", MASK, "--password=" + MASK]),
        (["--hf_token", "x", "--apiKey", "y"], ["--hf_token", MASK, "--apiKey", MASK]),
        (["HF_TOKEN=hf_abc", "WANDB_API_KEY=w"], ["HF_TOKEN=" + MASK, "WANDB_API_KEY=" + MASK]),
        (["AWS_SECRET_ACCESS_KEY=s", "python"], ["AWS_SECRET_ACCESS_KEY=" + MASK, "python"]),
        (["--data", "https://bob:pw@host/x"], ["--data", f"https://bob:{MASK}@host/x"]),
        (["git+https://ghp_tok@github.com/r"], [f"git+https://{MASK}@github.com/r"]),
        (["train.py", SECRET], ["train.py", MASK]),  # a known token shape, positional
        (["-H", "Authorization: Bearer abc"], ["-H", f"Authorization: Bearer {MASK}"]),
        # nothing secret (None): left exactly as it was
        (["--tokenizer", "gpt2", "--max-tokens", "5"], None),
        (["--lr=0.1", "--keep", "3", "--monkey", "x"], None),
        (["--token", "--lr", "1"], None),  # a flag without its value
        (["ssh://host/path", "user@host"], None),
    ],
)
def test_command_line_secrets_are_hidden(argv, expected):
    assert redact_argv(argv) == (argv if expected is None else expected)


def test_secret_names():
    for name in ("--api-key", "HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "apiKey"):
        assert is_secret_name(name), name
    for name in ("--tokenizer", "--max-tokens", "--keep", "PATH", "--monkey", "--passes"):
        assert not is_secret_name(name), name


def test_text_and_environment_redaction():
    line = "auth failed: --api-key abc; WANDB_API_KEY=zzz password: hunter2 at https://u:p@x.org"
    out = redact_text(line)
    for secret in ("abc", "zzz", "hunter2", ":p@"):
        assert secret not in out
    assert out.startswith("auth failed: --api-key ***")
    assert redact_text("Namespace(api_key='abc', lr=0.1)") == "Namespace(api_key=***, lr=0.1)"
    assert redact_text("step 5 loss 0.3 tokenizer gpt2") == "step 5 loss 0.3 tokenizer gpt2"
    assert redact_env({"HF_TOKEN": "a", "PATH": "/bin", "DB": "postgres://u:p@h/d"}) == {
        "HF_TOKEN": MASK,
        "PATH": "/bin",
        "DB": f"postgres://u:{MASK}@h/d",
    }
    assert redact_lines(None) is None


def test_recorder_header_is_redacted(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    # a key that no hex digest can hold (the recording's random id once held "abc")
    cmd = ["python", "train.py", "--api-key", "key-zqx", "--url=https://u:pw@h/x"]
    Recorder(str(path), {"run": {"mode": "run", "command": cmd, "pid": 1}}).close({})
    rec = open_recording(str(path))
    assert rec.header["run"]["command"] == [
        "python",
        "train.py",
        "--api-key",
        MASK,
        f"--url=https://u:{MASK}@h/x",
    ]
    assert b"zqx" not in gzip.decompress(path.read_bytes())


def test_reports_written_before_redaction_are_shown_redacted(tmp_path):
    """A report saved by an older gpudiag (secrets as is) is rendered with them hidden."""
    from pathlib import Path

    from gpudiag.agent.base.config import load_settings
    from gpudiag.agent.commands.replay import replay_report
    from gpudiag.agent.output.render.text import render_markdown, render_text

    fixture = Path(__file__).parents[1] / "fixtures" / "h100" / "ckpt.jsonl.gz"
    doc = replay_report(str(fixture), load_settings(None))
    doc["run"]["command"] = ["python", "train.py", "--api-key", SECRET]
    doc["run"]["stderr_tail"] = [f"bad key {SECRET}"]
    for text in (render_text(doc), render_markdown(doc)):
        assert SECRET not in text


@pytest.mark.parametrize(
    "arg, secret",
    [
        ("--apitoken=tok1", "tok1"),
        ("--dbpassword=pw1", "pw1"),
        ("https://acct.blob.core.windows.net/c/b?sv=2022&sig=SIGVALUE%3D&se=1", "SIGVALUE"),
        ("https://h/f?token=TOKVALUE&page=2", "TOKVALUE"),
        ("s3://b/k?X-Amz-Signature=deadbeef01&X-Amz-Date=1", "deadbeef01"),
        ("DefaultEndpointsProtocol=https;AccountName=a;AccountKey=AKEY==;x=1", "AKEY"),
        ("Endpoint=sb://x/;SharedAccessSignature=SASVALUE", "SASVALUE"),
        ("Server=db;User Id=u;Password=PWVALUE;", "PWVALUE"),
    ],
)
def test_round_two_secret_shapes_are_hidden_in_argv_and_text(arg, secret):
    """Issue 23 #3: unknown option names, URL query credentials and connection strings
    leaked; argv and text follow one set of rules."""
    for out in (" ".join(redact_argv(["train.py", arg])), redact_text(f"loading {arg} now")):
        assert secret not in out and MASK in out, out


def test_short_password_flag_and_joined_names():
    assert redact_argv(["mysql", "-u", "bob", "-p", "hunter2"]) == [
        "mysql",
        "-u",
        "bob",
        "-p",
        MASK,
    ]
    assert "hunter2" not in redact_text("ran mysql -u bob -p hunter2")
    for name in ("--apitoken", "--dbpassword", "--sastoken", "--sig", "AccountKey", "-p"):
        assert is_secret_name(name), name
    for name in ("--bypass", "--compass", "--top-p", "--max-tokens", "--keep", "-v"):
        assert not is_secret_name(name), name
