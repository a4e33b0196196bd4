"""One choke point per file boundary (issue 38): every file gpudiag writes goes through
`agent/base/safeio.py`, every file it reads through `probes/files.py` (or a /proc file of
the kernel's). These tests walk the package's source, as test_layering walks its imports,
and fail when code opens a file around them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probes", "analyzers", "text", "tui", "agent")

WRITER = "agent/base/safeio.py"
READER = "probes/files.py"
# modules that run inside the job (imported by its sitecustomize), as the job's own user, on
# files of the job's own private folder: they cannot import gpudiag's agent
IN_JOB = {
    "probes/inject/gpudiag_channel.py": "the hooks' private writer (O_EXCL|O_NOFOLLOW, 0700)",
    "probes/inject/gpudiag_fixes.py": "the step log `try` reads, in its private folder",
    "probes/inject/gpudiag_capture.py": "torch's profiler trace, in a mkstemp file",
}
# readers of the kernel's process tables under a /proc root passed in (tests give another)
PROCFS = {
    "probes/host/discovery.py": "/proc/PID/{stat,cmdline,maps} under the procfs root it is given",
    "probes/host/process.py": "/proc/PID/task/TID/{stat,schedstat}",
    "probes/host/probe.py": "PSI: /proc/pressure/* and the job cgroup's *.pressure (kernel files)",
    "agent/output/report.py": "the report's JSON Schema, a resource of the package",
    "analyzers/cost/prices.py": "the GPU models and prices table, a resource of the package",
}

_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}
_OPENERS = {"os", "io", "gzip", "bz2", "lzma", "codecs"}
_TEMPFILES = {"mkstemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"}


def _mode(call: ast.Call, pos: int) -> str | None:
    """The literal mode argument of an open-like call ('' when absent, None when computed)."""
    for kw in call.keywords:
        if kw.arg == "mode":
            return kw.value.value if isinstance(kw.value, ast.Constant) else None
    if len(call.args) > pos:
        arg = call.args[pos]
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
    return ""


def _is_proc(node: ast.AST | None) -> bool:
    """Whether a path argument is a literal under /proc/ (the kernel's files), or
    `Path(...)` of one."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path":
        return _is_proc(node.args[0] if node.args else None)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("/proc/")
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and str(first.value).startswith("/proc/")
    return False


def _os_open_writes(call: ast.Call) -> bool:
    """Whether os.open's flags ask to write (flags in a variable: taken as a write)."""
    flags = call.args[1] if len(call.args) > 1 else None
    names = {n.attr for n in ast.walk(flags) if isinstance(n, ast.Attribute)} if flags else set()
    return not names or bool(names & _WRITE_FLAGS)


def _writes(mode: str | None) -> bool:
    return mode is None or any(c in mode for c in "wax+")


def file_opens(source: str, name: str = "<snippet>") -> list[tuple[int, str]]:
    """(line, 'read'|'write') for each place the code opens a file by its path."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        attr = f.attr if isinstance(f, ast.Attribute) else ""
        path = node.args[0] if node.args else None
        if isinstance(f, ast.Name) and f.id == "open" or (attr == "open" and owner in _OPENERS):
            if owner == "os":
                kind = "write" if _os_open_writes(node) else "read"
            else:
                kind = "write" if _writes(_mode(node, 1)) else "read"
            if not (kind == "read" and _is_proc(path)):
                found.append((node.lineno, kind))
        elif attr == "fdopen" and _writes(_mode(node, 1)):
            found.append((node.lineno, "write"))
        elif attr in ("write_text", "write_bytes") or attr in _TEMPFILES:
            found.append((node.lineno, "write"))
        elif attr in ("read_text", "read_bytes") and not _is_proc(f.value):
            found.append((node.lineno, "read"))
    return found


def _package_opens() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            opens = file_opens(path.read_text(), rel)
            if opens:
                out[rel] = opens
    return out


def test_the_walker_sees_the_writes_and_reads_that_went_around():
    """The shapes of the old holes are found (a test that cannot fail holds nothing)."""
    old = [
        'log = open(log_path, "ab")',  # run --tui's job log
        'with open(args.out, "w") as f: pass',  # try --out
        'with open(summary, "a") as f: pass',  # GITHUB_STEP_SUMMARY
        'lines = open(cand, encoding="utf-8").readlines()',  # a frame's source file
        'data = open(path, "rb").read()',  # the flight recorder
        "doc = json.load(open(report))",  # try's report, and the PID it named
        "fd = os.open(tmp, os.O_WRONLY | os.O_CREAT)",
        "Path(p).write_text(s)",
    ]
    kinds = [file_opens(s)[0][1] if file_opens(s) else None for s in old]
    assert kinds == ["write", "write", "write", "read", "read", "read", "write", "write"]
    assert file_opens('open(f"/proc/{pid}/stat")') == []  # the kernel's files: read anywhere
    assert file_opens('open(f"/proc/{pid}/stat", "w")') == [(1, "write")]
    assert file_opens('Path(f"/proc/{pid}/cmdline").read_bytes()') == []
    assert file_opens("Path(frame_file).read_text()") == [(1, "read")]


def test_every_write_goes_through_the_safe_writer():
    """Only agent/base/safeio.py opens a file for writing (and the in-job hooks, as the
    job's user, in its private folder)."""
    stray = {
        rel: [ln for ln, kind in opens if kind == "write"]
        for rel, opens in _package_opens().items()
        if rel != WRITER and rel not in IN_JOB
    }
    assert {k: v for k, v in stray.items() if v} == {}


def test_every_read_goes_through_the_bounded_reader():
    """Only probes/files.py opens a file by its path for reading (besides /proc's)."""
    stray = {
        rel: [ln for ln, kind in opens if kind == "read"]
        for rel, opens in _package_opens().items()
        if rel != READER and rel not in IN_JOB and rel not in PROCFS
    }
    assert {k: v for k, v in stray.items() if v} == {}


# ---- outbound text: one sink ------------------------------------------------------------------

SINK = "text/sink.py"
# text that leaves gpudiag around the sink, with the reason it may
RAW_OUT = {
    "agent/commands/demo_job.py": "the demo's own training job (a child process), not gpudiag",
    "agent/session/joboutput.py": "the job's own stderr passed through as it wrote it (no UI)",
    "agent/session/signals.py": "a fixed line from a signal handler (os.write: no locks)",
    "probes/inprocess/ptrace_helper.py": "the hooks loader's one JSON line to the agent that "
    "ran it, on a pipe (a helper process, not gpudiag's UI)",
    "probes/inprocess/calibrate.py": "the calibration child's one JSON line of rates to the "
    "agent that ran it, on a pipe (a child process, not gpudiag's UI)",
}
_STD = {"stdout", "stderr", "__stdout__", "__stderr__"}


def _is_std_stream(node: ast.AST) -> bool:
    """`sys.stdout`, `sys.stderr` (or `.buffer` of either)."""
    if isinstance(node, ast.Attribute) and node.attr == "buffer":
        node = node.value
    return (
        isinstance(node, ast.Attribute)
        and node.attr in _STD
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def text_outs(source: str, name: str = "<snippet>") -> list[int]:
    """Lines where the code puts text on a terminal or pipe itself: `print(...)`,
    `sys.stdout.write(...)`, `sys.stderr.buffer.write(...)`, `os.write(1 or 2, ...)`."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "print":
            found.append(node.lineno)
        elif isinstance(f, ast.Attribute) and f.attr in ("write", "writelines"):
            if _is_std_stream(f.value):
                found.append(node.lineno)
            elif isinstance(f.value, ast.Name) and f.value.id == "os" and node.args:
                if _fd_is_std(node.args[0]):
                    found.append(node.lineno)
    return found


def _fd_is_std(fd: ast.AST) -> bool:
    """os.write's first argument: 1, 2, or `sys.stdout.fileno()` (a variable: not a tty)."""
    if isinstance(fd, ast.Constant):
        return fd.value in (1, 2)
    return (
        isinstance(fd, ast.Call)
        and isinstance(fd.func, ast.Attribute)
        and _is_std_stream(fd.func.value)
    )


def test_the_walker_sees_text_that_goes_around_the_sink():
    """The shapes of the old holes are found: the summary, the progress line, watch's log."""
    old = [
        "print(render_text(doc, verbose=False))",
        'self.log = log or (lambda msg: print(f"gpudiag: {msg}", file=sys.stderr))',
        'sys.stderr.write(f"watching pid {pid} ({cmd})\\n")',
        "sys.stdout.buffer.write(data)",
        'os.write(2, f"gpudiag: {msg}".encode())',
        "os.write(sys.stdout.fileno(), data)",
    ]
    assert [text_outs(s) for s in old] == [[1]] * len(old)
    assert text_outs("os.write(fd, view)") == []  # a file of the safe writer's
    assert text_outs("console.print(self)") == []  # Rich into a capture buffer
    assert text_outs("emit(text)") == []


def test_every_outbound_text_goes_through_the_sink():
    """Only text/sink.py puts text on stdout or stderr (it redacts and strips escapes)."""
    stray = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == SINK or rel in RAW_OUT or rel.startswith("probes/inject/"):
                continue
            lines = text_outs(path.read_text(), rel)
            if lines:
                stray[rel] = lines
    assert stray == {}


# ---- processes and connections: one place each (issue 53) ----------------------------------

SPAWNER = "probes/spawn.py"
NETWORK = "probes/net.py"
# connections opened around probes/net.py, with the reason they may
RAW_NET = {
    "agent/fleet/otlp.py": "the OpenTelemetry SDK's exporters, to the endpoint the user gave "
    "with --otlp (never one a job names)",
}
_SUBPROCESS = {"Popen", "run", "call", "check_call", "check_output", "getoutput"}
_SUBPROCESS |= {"getstatusoutput"}
_OS_SPAWN = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
_NET_CALLS = {"urlopen", "urlretrieve", "HTTPConnection", "HTTPSConnection", "create_connection"}
_NET_CALLS |= {"PoolManager", "ClientSession", "AsyncClient", "OTLPMetricExporter"}
_NET_CALLS |= {"OTLPLogExporter", "OTLPSpanExporter"}
_NET_MODULES = {"requests", "httpx", "urllib3", "aiohttp"}


def _call_name(call: ast.Call) -> tuple[str, str]:
    """(owner, name) of a call: ('subprocess', 'Popen'), ('', 'urlopen'), ('sock', 'connect')."""
    f = call.func
    if isinstance(f, ast.Name):
        return "", f.id
    if isinstance(f, ast.Attribute):
        v = f.value
        owner = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else ""
        return owner, f.attr
    return "", ""


def process_starts(source: str, name: str = "<snippet>") -> list[int]:
    """Lines where the code starts a process itself (subprocess, os.exec*/spawn*/system,
    pty.spawn, asyncio's subprocesses), or imports one of subprocess's starters by name."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.ImportFrom) and node.module == "subprocess":
            if any(a.name in _SUBPROCESS for a in node.names):
                found.append(node.lineno)
        if not isinstance(node, ast.Call):
            continue
        owner, attr = _call_name(node)
        if (
            (owner == "subprocess" and attr in _SUBPROCESS)
            or (owner == "os" and (attr in _OS_SPAWN or attr.startswith(("exec", "spawn"))))
            or (owner == "pty" and attr == "spawn")
            or attr in ("create_subprocess_exec", "create_subprocess_shell")
        ):
            found.append(node.lineno)
    return found


def connections(source: str, name: str = "<snippet>") -> list[int]:
    """Lines where the code opens a connection itself: an HTTP client of the standard
    library or a known one, `socket.create_connection`, `.connect(...)`/`.connect_ex(...)`
    on anything, an OTLP exporter."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Call):
            owner, attr = _call_name(node)
            if attr in _NET_CALLS or attr in ("connect", "connect_ex") or owner in _NET_MODULES:
                found.append(node.lineno)
        elif isinstance(node, ast.Import) and any(
            a.name.split(".")[0] in _NET_MODULES for a in node.names
        ):
            found.append(node.lineno)
    return found


def test_the_walkers_see_processes_and_connections_that_went_around():
    """The shapes of the old holes are found: the version probe that ran a job's binary as
    root, the Triton scrape of a URL the job's command line named."""
    procs = [
        'subprocess.run([f"/proc/{pid}/exe", "-I", "-S", "-c", code], capture_output=True)',
        'proc = subprocess.Popen(["cat"], stdin=fd)',
        "from subprocess import check_output",
        'os.execv("/bin/sh", ["sh"])',
        'os.system("id")',
        'await asyncio.create_subprocess_exec("py-spy")',
    ]
    assert [process_starts(s) for s in procs] == [[1]] * len(procs)
    assert process_starts("try:\n    pass\nexcept subprocess.TimeoutExpired:\n    pass") == []
    assert process_starts("proc: subprocess.Popen | None = None") == []
    nets = [
        "urllib.request.urlopen(url, timeout=0.5)",
        "conn = http.client.HTTPConnection(host, port)",
        "s = socket.create_connection((host, port))",
        "sock.connect(path)",
        "import requests",
        "requests.get(url)",
        "OTLPMetricExporter(endpoint=metrics)",
    ]
    assert [connections(s) for s in nets] == [[1]] * len(nets)
    assert connections("sock.bind(path)") == []


def _walk(find) -> dict[str, list[int]]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            lines = find(path.read_text(), rel)
            if lines:
                out[rel] = lines
    return out


def test_every_process_is_started_by_the_spawner():
    """Only probes/spawn.py starts a process (argv lists, no shell, nothing under /proc)."""
    assert {k: v for k, v in _walk(process_starts).items() if k != SPAWNER} == {}


def test_every_connection_is_opened_by_the_network_module():
    """Only probes/net.py opens a connection (and the OTLP SDK, to the user's endpoint)."""
    stray = {k: v for k, v in _walk(connections).items() if k != NETWORK and k not in RAW_NET}
    assert stray == {}
    assert all(connections((ROOT / k).read_text()) for k in RAW_NET)  # no stale exception


# ---- a job's process files of the size it chooses: read to a limit ---------------------------

HEAD_READER = "probes/files.py"
# the ones read around it, with the reason they may
RAW_PROC = {
    "probes/inprocess/ptrace_helper.py": "the hooks loader's helper process (run with -I, "
    "imports nothing of gpudiag): the job's memory map line by line, once",
}
_JOB_SIZED = ("/environ", "/cmdline", "/maps", "/smaps", "/numa_maps", "/mountinfo")


def _literal_text(node: ast.AST | None) -> str | None:
    """The text of a literal path argument (an f-string's literal pieces joined), or None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path":
        return _literal_text(node.args[0] if node.args else None)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def job_sized_reads(source: str, name: str = "<snippet>") -> list[int]:
    """Lines where the code opens a job's environ, cmdline or memory map by a literal /proc
    path itself (open, Path(...).read_*), instead of read_head's bounded read."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (
            isinstance(f, ast.Name)
            and f.id == "open"
            or isinstance(f, ast.Attribute)
            and (f.attr == "open" and isinstance(f.value, ast.Name) and f.value.id in _OPENERS)
        ):
            text = _literal_text(node.args[0] if node.args else None)
        elif isinstance(f, ast.Attribute) and f.attr in ("read_text", "read_bytes", "open"):
            text = _literal_text(f.value)
        else:
            continue
        if text and text.startswith("/proc/") and text.endswith(_JOB_SIZED):
            found.append(node.lineno)
    return found


def test_the_walker_sees_a_job_sized_read_that_went_around():
    old = [
        'env = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")',
        'raw = Path(f"/proc/{pid}/environ").read_bytes()',
        'maps = open(f"/proc/{pid}/maps").read()',
        'fd = os.open(f"/proc/{pid}/cmdline", os.O_RDONLY)',
    ]
    assert [job_sized_reads(s) for s in old] == [[1]] * len(old)
    assert job_sized_reads('read_head(f"/proc/{pid}/environ", MAX_ENVIRON_BYTES)') == []
    assert job_sized_reads('open(f"/proc/{pid}/stat")') == []  # one short line


def test_every_job_sized_process_file_is_read_to_a_limit():
    """A job's environ, cmdline and memory map are read only through probes/files.read_head
    (issue 53: discovery read 1.8 MB command lines and 30,000-line maps in whole, each poll)."""
    stray = {k: v for k, v in _walk(job_sized_reads).items() if k != HEAD_READER}
    assert {k: v for k, v in stray.items() if k not in RAW_PROC} == {}
    assert all(k in stray for k in RAW_PROC)  # no stale exception
