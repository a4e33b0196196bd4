"""Secrets kept out of everything gpudiag writes or shows: reports, recordings, the job's
stderr tail, progress lines and the terminal UI.

A value is hidden (replaced by `***`) when it belongs to a command-line option or an
environment variable whose name looks like a credential (`--api-key X`, `--api-key=X`,
`--token`, `--password`, `HF_TOKEN=...`, `WANDB_API_KEY=...`, `AWS_SECRET_ACCESS_KEY=...`),
when it is the password (or the bare user token) of a URL (`https://user:pass@host`), a
secret-named URL query parameter (`?token=`, `&sig=`, `X-Amz-Signature=`) or connection-string
field (`AccountKey=`, `SharedAccessSignature=`, `Password=`), an `Authorization:` header
value, or when it has the shape of a well-known token (`sk-...`, `hf_...`, `ghp_...`,
`AKIA...`) wherever it stands. Names are split into words (`--api-key`,
`apiKey` and `API_KEY` all give `api key`), so `--tokenizer` or `--max-tokens` stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

# One set of rules, for command lines, environment variables and free text alike: a name is
# secret when one of its words is one of these, or ends with one of SECRET_ENDINGS
# (`--apitoken`, `--dbpassword`, `AccountKey`, `X-Amz-Signature`), unless it is a known
# harmless word (`--monkey`, `--passes`); `-p` (a password, as in mysql) is secret too.
SECRET_WORDS = frozenset(
    {
        "token",
        "key",
        "apikey",
        "secret",
        "secrets",
        "password",
        "passwd",
        "pass",
        "pwd",
        "passphrase",
        "credential",
        "credentials",
        "auth",
        "signature",
        "sig",
        "sas",
        "cookie",
        "bearer",
        "privatekey",
        "accesskey",
        "secretkey",
        "authtoken",
        "accesstoken",
    }
)
SECRET_ENDINGS = (
    "token",
    "key",
    "secret",
    "password",
    "passwd",
    "pass",
    "passphrase",
    "credential",
    "credentials",
    "auth",
    "signature",
)
NOT_SECRET_WORDS = frozenset(
    {"monkey", "donkey", "hotkey", "turkey", "hockey", "jockey", "whiskey"}
    | {"bypass", "compass", "surpass", "trespass", "encompass", "multipass", "overpass"}
)
SHORT_SECRET_FLAGS = frozenset({"-p"})

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")
# scheme://user:password@host or scheme://token@host
_URL_CRED = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/@'\"]+)@")
_AUTH_HEADER = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization\s*[:=]\s*(?:(?:bearer|basic|token)\s+)?)(?P<value>\S+)",
    re.IGNORECASE,
)
# well-known token shapes, found wherever they stand (positional arguments, log lines)
_TOKEN_SHAPES = re.compile(
    r"\b(?:"
    r"sk-[A-Za-z0-9_\-]{16,}"  # OpenAI, Anthropic and similar API keys
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r")"
)
# NAME=value or --name=value / --name value inside free text (a log line, an echoed command)
_NAME_SEP = re.compile(
    r"(?P<name>(?<![\w-])-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)(?P<sep>=|:[ \t]*|[ \t]+)"
)
_VALUE = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|[^\s'\";,&]+")


def is_secret_name(name: str) -> bool:
    """Whether an option or variable name (`--api-key`, `HF_TOKEN`, `apiKey`, `-p`) names a
    secret."""
    if name in SHORT_SECRET_FLAGS:
        return True
    name = name.lstrip("-")
    words = [w.lower() for w in _WORD_SPLIT.split(_CAMEL.sub("_", name)) if w]
    if not words:
        return False
    return any(_secret_word(w) for w in words) or "".join(words) in SECRET_WORDS


def _secret_word(word: str) -> bool:
    if word in NOT_SECRET_WORDS:
        return False
    return word in SECRET_WORDS or word.endswith(SECRET_ENDINGS)


def _redact_url(match: re.Match) -> str:
    user, colon, _password = match.group("userinfo").partition(":")
    if colon:
        return f"{match.group('scheme')}{user}:{MASK}@"
    return f"{match.group('scheme')}{MASK}@"


def redact_text(text: str) -> str:
    """Free text with URL credentials, Authorization values and known token shapes hidden,
    and the values of `--secret-name value`, `--secret-name=value` and `SECRET_NAME=value`."""
    if not text:
        return text
    out = _URL_CRED.sub(_redact_url, text)
    out = _AUTH_HEADER.sub(lambda m: m.group("head") + MASK, out)
    out = _TOKEN_SHAPES.sub(MASK, out)

    return _hide_assignments(out)


def _hide_assignments(text: str) -> str:
    parts: list[str] = []
    done = i = 0
    while (m := _NAME_SEP.search(text, i)) is not None:
        name, sep = m.group("name"), m.group("sep")
        value = _VALUE.match(text, m.end())
        hide = (
            value is not None
            and value.group() != MASK
            and is_secret_name(name)
            and (sep.strip() != "" or name.startswith("-"))  # `word value`: options only
            and not (sep.strip() == "" and value.group().startswith("-"))
        )
        if hide and value is not None:
            parts += [text[done : m.end()], MASK]
            done = i = value.end()
        else:
            i = m.end("name")
    parts.append(text[done:])
    return "".join(parts)


def redact_argv(argv: Iterable[str] | None) -> list[str] | None:
    """A command line with secret values hidden, element by element (None stays None)."""
    if argv is None:
        return None
    args = [str(a) for a in argv]
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            hide_next = False
            if not arg.startswith("--"):
                out.append(MASK)
                continue
        name, eq, _value = arg.partition("=")
        if eq and is_secret_name(name) and re.fullmatch(r"-{0,2}[A-Za-z_][\w.\-]*", name):
            out.append(f"{name}{eq}{MASK}")
            continue
        if arg.startswith("-") and not eq and (len(arg) > 2 or arg in SHORT_SECRET_FLAGS):
            hide_next = is_secret_name(arg)
        out.append(redact_text(arg))  # the same rules as for text: URLs, query strings, ...
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Environment variables with the values of secret-named ones (and URL credentials in
    any value) hidden."""
    return {k: (MASK if is_secret_name(k) else redact_text(str(v))) for k, v in env.items()}


def redact_lines(lines: Iterable[str] | None) -> list[str] | None:
    """Lines of text (a stderr tail) with secrets hidden."""
    if lines is None:
        return None
    return [redact_text(line) for line in lines]
