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

_EXCEPTION_NAME = re.compile(r"(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Warning)")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")
# scheme://user:password@host or scheme://token@host. The scheme takes the whole run of
# scheme characters, and the match is that run alone when no `://userinfo@` follows it: no
# later start inside the same run could match, so none is tried (linear time on `a.a.a...`).
_URL_CRED = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*)(?:(?P<sep>://)(?P<userinfo>[^\s/@'\"]+)@)?"
)
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
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe secret and restricted keys
    r"|AIza[0-9A-Za-z_\-]{35}"  # Google API keys
    r")"
)
# a JWT (eyJ<8+>.eyJ<8+>.<8+>), found from its `.eyJ` in the middle: a start at every `eyJ`
# of a run would rescan the run from each one (quadratic on `eyJ-eyJ-...`)
_JWT_TAIL = re.compile(r"\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8}")
_JWT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# a bare `Bearer TOKEN` (no Authorization: before it)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?P<value>[A-Za-z0-9._~+/\-]+=*)", re.IGNORECASE)
# user:password@host without a scheme (`admin:s3cret@db:5432`, a DSN's tail)
_BARE_CRED = re.compile(
    r"(?<![\w/:@.\-])(?P<user>[A-Za-z0-9_.\-]+):(?P<pw>[^\s:@/'\"]+)@(?=[\w\[])"
)
# "name": "value" and 'name': value (JSON, a printed dict) and '--name', 'value' (a printed
# argv list): the value of a secret name hidden
# (the value is looked at only after a secret name, and the search goes on inside the value
# of any other name: `'--config', '{"api_key": "S"}'` hides S)
_QUOTED_NAME = re.compile(
    r"(?P<head>(?P<q>[\"'])(?P<name>-{0,2}[A-Za-z_][\w.\-]*)(?P=q)\s*(?:[:=,])\s*)"
)
_QUOTED_VALUE = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s,}\]]+")
# mysql's -pPASSWORD as one quoted element of a printed argv list (`'-pS3cret'`), as
# redact_argv hides it in a command line
_QUOTED_MYSQL_P = re.compile(
    r"(?:(?<=\[)|(?<=,)|(?<=, ))(?P<q>[\"'])-p[^\s\"'\-][^\s\"']*(?P=q)(?=\s*[,\])])"
)
# a PEM private key, whole or from its first line on
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|.*)",
    re.DOTALL,
)
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----")
# mysql's -pPASSWORD (the password joined to -p), in text after a mysql-like command
# (when no -p follows the first mysql word of a line, the rest of the line is taken whole:
# no later mysql word on it could have one, and trying each would rescan the line)
_MYSQL_P = re.compile(
    r"(?P<head>\b(?:mysql|mariadb)\w*(?:[^\n]*?\s-p(?=[^\s-])|(?P<none>[^\n]*)))"
    r"(?P<value>(?(none)|\S+))"
)
# NAME=value or --name=value / --name value inside free text (a log line, an echoed command)
# (the name takes its whole run of name characters, and the match is that run alone when no
# separator follows: no later start inside the run could match, so none is tried)
_NAME_SEP = re.compile(
    r"(?P<name>(?<![\w-])-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)(?P<sep>[ \t]*=[ \t]*|:[ \t]*|[ \t]+)?"
)
_VALUE = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|[^\s'\";,&]+")


def is_secret_name(name: str) -> bool:
    """Whether an option or variable name (`--api-key`, `HF_TOKEN`, `apiKey`, `-p`) names a
    secret."""
    if name in SHORT_SECRET_FLAGS:
        return True
    if _EXCEPTION_NAME.fullmatch(name):  # `KeyError: 'ts'` names an exception, not a key
        return False
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
    if match.group("sep") is None:  # a run of scheme characters with no credentials after it
        return match.group(0)
    user, colon, _password = match.group("userinfo").partition(":")
    if colon:
        return f"{match.group('scheme')}://{user}:{MASK}@"
    return f"{match.group('scheme')}://{MASK}@"


# Text longer than this is cut before any rule runs on it (at a space near the cut, so that no
# secret is left half-shown), and what was cut is said: every rule runs in time linear in its
# input, and this bounds the constant (a 2 MB command line costs what 64 KB does).
MAX_TEXT_CHARS = 64 * 1024
_CUT_BACK = 4096  # how far before the cut a space is looked for


def redact_text(text: str, limit: int | None = MAX_TEXT_CHARS) -> str:
    """Free text with URL credentials, Authorization values and known token shapes hidden,
    and the values of `--secret-name value`, `--secret-name=value` and `SECRET_NAME=value`.
    Text over `limit` characters is cut first, and the cut is said (None: a document of
    gpudiag's own, a rendered report, is never cut: the rules are linear)."""
    if not text:
        return text
    if limit is None:
        return _redact(text)
    head, note = _cut(text, limit)
    return _redact(head) + note


def _cut(text: str, limit: int) -> tuple[str, str]:
    """The text's first `limit` characters (back to a space near there, if any) and a note
    of what was cut ("" when nothing was)."""
    if len(text) <= limit:
        return text, ""
    head = text[:limit]
    space = max(head.rfind(c, limit - min(_CUT_BACK, limit // 2)) for c in " \t\n")
    head = head[: space + 1] if space >= 0 else head  # else a word longer than the look-back
    return head, f"… [{len(text) - len(head)} characters cut]"


def _redact(text: str) -> str:
    """Every rule over the whole text (each in time linear in its length)."""
    out = _PEM.sub(MASK, text)
    out = _URL_CRED.sub(_redact_url, out)
    out = _BARE_CRED.sub(lambda m: f"{m.group('user')}:{MASK}@", out)
    out = _AUTH_HEADER.sub(lambda m: m.group("head") + MASK, out)
    out = _BEARER.sub(lambda m: m.group("head") + MASK, out)
    out = _hide_jwts(_TOKEN_SHAPES.sub(MASK, out))
    out = _hide_quoted_pairs(out)
    out = _QUOTED_MYSQL_P.sub(lambda m: f"{m.group('q')}-p{MASK}{m.group('q')}", out)
    out = _MYSQL_P.sub(
        lambda m: m.group(0) if m.group("none") is not None else m.group("head") + MASK, out
    )
    return _hide_assignments(out)


def _hide_jwts(text: str) -> str:
    """JWTs hidden: from each `.eyJ<8+>.<8+>` back over its run of base64url characters to
    the first `eyJ` that starts a word there, with 8 or more characters before the dot."""
    parts: list[str] = []
    done = 0
    dot = text.find(".eyJ")
    while dot >= 0:
        tail = _JWT_TAIL.match(text, dot)
        start = dot
        while tail is not None and start > done and text[start - 1] in _JWT_CHARS:
            start -= 1
        first = None if tail is None else _first_jwt_head(text, start, dot)
        if tail is None or first is None:
            dot = text.find(".eyJ", dot + 1)
            continue
        parts += [text[done:first], MASK]
        done = tail.end()
        while done < len(text) and text[done] in _JWT_CHARS:  # the signature's whole run
            done += 1
        dot = text.find(".eyJ", done)
    parts.append(text[done:])
    return "".join(parts)


def _first_jwt_head(text: str, start: int, dot: int) -> int | None:
    if dot - 8 <= start:  # (a negative end would count from the end of the text)
        return None
    i = text.find("eyJ", start, dot - 8)
    while i >= 0:
        if i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"):  # a word starts
            return i
        i = text.find("eyJ", i + 1, dot - 8)
    return None


def _hide_quoted_pairs(text: str) -> str:
    """`"name": "value"`, `'name': value` and `'--name', 'value'` with a secret name: the
    value hidden; inside any other pair's value the search goes on."""
    parts: list[str] = []
    done = i = 0
    while (m := _QUOTED_NAME.search(text, i)) is not None:
        i = m.end()
        if not is_secret_name(m.group("name")):
            continue
        value = _QUOTED_VALUE.match(text, i)
        if value is None or value.group().strip("\"'") == MASK:
            continue
        q = value.group()[0] if value.group()[0] in "\"'" else ""
        parts += [text[done:i], f"{q}{MASK}{q}"]
        done = i = value.end()
    parts.append(text[done:])
    return "".join(parts)


def _hide_assignments(text: str) -> str:
    parts: list[str] = []
    done = i = 0
    while (m := _NAME_SEP.search(text, i)) is not None:
        name, sep = m.group("name"), m.group("sep")
        i = m.end("name")
        if sep is None or not is_secret_name(name):
            continue
        if sep.strip() == "" and not name.startswith("-"):  # `word value`: options only
            continue
        value = _VALUE.match(text, m.end())
        if value is None or value.group() == MASK:
            continue
        if sep.strip() == "" and value.group().startswith("-"):
            continue
        parts += [text[done : m.end()], MASK]
        done = i = value.end()
    parts.append(text[done:])
    return "".join(parts)


# terminal escapes (CSI, OSC, and the rest) removed whole, then any other control character
_ESCAPES = re.compile(
    r"\x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC: title, hyperlink, clipboard
    r"|\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: colours, cursor moves, erase
    r"|\x1b[P^_X][^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, PM, APC, SOS strings
    r"|\x9b[0-?]*[ -/]*[@-~]?|\x9d[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # C1 CSI, OSC
    r"|\x1b.?"  # any other escape
)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SURROGATES = re.compile("[\ud800-\udfff]")  # half a pair: no terminal or file can take it


def printable(text: str, lines: bool = False) -> str:
    """Text fit to show on a terminal or in a log: escape sequences (ESC, OSC, CSI) and
    other control characters removed (a tab kept), a lone surrogate shown as U+FFFD; a
    newline or carriage return becomes a space unless `lines` (so job-controlled text cannot
    forge a log line)."""
    if not text:
        return text
    out = _SURROGATES.sub("\ufffd", _ESCAPES.sub("", text))
    out = out.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROLS.sub("", out if lines else out.replace("\n", " "))


def shown(text: str, lines: bool = False, limit: int | None = MAX_TEXT_CHARS) -> str:
    """Job-controlled text as it leaves gpudiag for a terminal, the UI or a log: secrets
    hidden, then control characters removed (`printable`); cut at `limit` characters first."""
    return printable(redact_text(text, limit), lines)


MAX_ARGV_CHARS = 4 * MAX_TEXT_CHARS  # of a command line, the rest cut (and said)


def redact_argv(argv: Iterable[str] | None, limit: int = MAX_ARGV_CHARS) -> list[str] | None:
    """A command line with secret values hidden, element by element (None stays None); past
    `limit` characters in all, the rest is cut and its number of arguments said."""
    if argv is None:
        return None
    args = [str(a) for a in argv]
    out: list[str] = []
    hide_next = False
    left = limit
    for k, arg in enumerate(args):
        if left <= 0:
            out.append(f"… [{len(args) - k} more arguments cut]")
            break
        head, note = _cut(arg, min(left, MAX_TEXT_CHARS))
        left -= len(head)
        shown_arg, hide_next = _redact_arg(head, hide_next)
        out.append(shown_arg + note)
    return out


def _redact_arg(arg: str, hide: bool) -> tuple[str, bool]:
    """One argument as shown (hidden whole when `hide`: the value of a secret option before
    it), and whether the next one is hidden."""
    if hide and not arg.startswith("--"):
        return MASK, False
    name, eq, _value = arg.partition("=")
    if eq and is_secret_name(name) and re.fullmatch(r"-{0,2}[A-Za-z_][\w.\-]*", name):
        return f"{name}{eq}{MASK}", False
    if re.fullmatch(r"-p[^\s-].*", arg, re.DOTALL):  # mysql's -pPASSWORD
        return f"-p{MASK}", False
    hide_next = False
    if arg.startswith("-") and not eq and (len(arg) > 2 or arg in SHORT_SECRET_FLAGS):
        hide_next = is_secret_name(arg)
    return _redact(arg), hide_next  # the same rules as for text: URLs, query strings, ...


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Environment variables with the values of secret-named ones (and URL credentials in
    any value) hidden."""
    return {k: (MASK if is_secret_name(k) else redact_text(str(v))) for k, v in env.items()}


def redact_lines(lines: Iterable[str] | None) -> list[str] | None:
    """Lines of text (a stderr tail) with secrets hidden."""
    if lines is None:
        return None
    out, in_key = [], False
    for line in lines:  # a PEM private key over several lines: every line of it hidden
        if in_key:
            in_key = not _PEM_END.search(line)
            out.append(MASK)
            continue
        red = redact_text(line)
        in_key = bool(_PEM.search(line)) and not _PEM_END.search(line)
        out.append(red)
    return out
