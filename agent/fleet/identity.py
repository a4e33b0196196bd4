"""A job's identity as the cluster sees it, for metric labels: Kubernetes pod, namespace and
container (the process's cgroup and the downward-API variables), Slurm job and step (its
environment), its user and a short command with secrets left out.

Every value is bounded: no step numbers, no paths, no free text longer than `COMMAND_MAX`.
"""

from __future__ import annotations

import os
import pwd
import re
import socket
from pathlib import Path

from gpudiag.probes.files import MAX_CMDLINE_BYTES, MAX_ENVIRON_BYTES, read_head
from gpudiag.text.redact import printable, redact_argv

COMMAND_MAX = 80  # characters of the command label
# the pod's UID and the container's id in a kubepods cgroup path, for both cgroup drivers:
#   /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
#       cri-containerd-<id>.scope
#   /kubepods/burstable/pod<uid>/<id>
_POD_UID = re.compile(r"kubepods.*?pod([0-9a-fA-F]{8}[-_][0-9a-fA-F_-]{27})")
_CONTAINER = re.compile(r"(?:docker|cri-containerd|crio|containerd)-([0-9a-f]{12,64})\.scope$")
_CONTAINER_PLAIN = re.compile(r"/pod[0-9a-fA-F_-]{36}/([0-9a-f]{12,64})$")

LABELS = (
    "pid",
    "user",
    "command",
    "pod",
    "namespace",
    "container",
    "pod_uid",
    "slurm_job_id",
    "slurm_step_id",
    "Hostname",
)
"""Every job label, in order; a value that is not known is the empty string."""


def hostname() -> str:
    """The node's name, as dcgm-exporter writes it in its `Hostname` label."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def parse_cgroup(text: str) -> dict[str, str]:
    """The pod UID and container id in a /proc/PID/cgroup text (empty when not in a pod)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        m = _POD_UID.search(path)
        if not m:
            continue
        out["pod_uid"] = m.group(1).replace("_", "-")
        c = _CONTAINER.search(path) or _CONTAINER_PLAIN.search(path)
        if c:
            out["container_id"] = c.group(1)[:12]
        break
    return out


def redact_command(argv: list[str], limit: int = COMMAND_MAX) -> str:
    """A short command for a label: secrets hidden as in reports (text/redact.py: values of
    options and variables named like keys, tokens or passwords, URL credentials, token
    shapes), paths cut to their base name, at most `limit` characters."""
    words: list[str] = []
    for arg in redact_argv(argv, limit=4 * limit) or []:  # cut before it is matched
        if "/" in arg:
            head, _, value = arg.rpartition("=") if arg.startswith("-") else ("", "", arg)
            base = value.rstrip("/").rsplit("/", 1)[-1] or value
            arg = f"{head}={base}" if head else base
        words.append(arg)
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = read_head(f"/proc/{pid}/environ", MAX_ENVIRON_BYTES)
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _user(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def identity_from(
    pid: int, argv: list[str], cgroup: str, env: dict[str, str], user: str, host: str
) -> dict[str, str]:
    """The job labels from what /proc says about it (see LABELS)."""
    cg = parse_cgroup(cgroup)
    in_pod = bool(cg) or "KUBERNETES_SERVICE_HOST" in env
    pod = env.get("POD_NAME") or (env.get("HOSTNAME", "") if in_pod else "")
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or ""
    labels = {
        "pid": str(pid),
        "user": user,
        "command": redact_command(argv),
        "pod": pod,
        "namespace": env.get("POD_NAMESPACE", ""),
        "container": env.get("CONTAINER_NAME") or cg.get("container_id", ""),
        "pod_uid": cg.get("pod_uid", ""),
        "slurm_job_id": env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "",
        "slurm_step_id": step,
        "Hostname": host,
    }
    return {k: bounded_label(v, MAX_COMMAND_CHARS if k == "command" else MAX_LABEL_CHARS)
            for k, v in labels.items()}  # fmt: skip


MAX_LABEL_CHARS = 253  # a Kubernetes name's limit; the job's environment sets these
MAX_COMMAND_CHARS = 1024


def bounded_label(value: str, limit: int = MAX_LABEL_CHARS) -> str:
    """A label value from the job (its environment, its argv): controls dropped, then cut
    (a 5,000-character POD_NAME went into every metric's labels)."""
    return printable(str(value))[:limit]


def job_identity(pid: int, argv: list[str] | None = None) -> dict[str, str]:
    """The labels of the job with root process `pid` (what cannot be read is empty)."""
    if argv is None:
        try:
            raw = read_head(f"/proc/{pid}/cmdline", MAX_CMDLINE_BYTES)
            argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        except OSError:
            argv = []
    try:
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        cgroup = ""
    return identity_from(pid, argv, cgroup, _environ(pid), _user(pid), hostname())


def other_user(pid: int) -> str | None:
    """Why another user's process cannot be read (None when it is ours, or we are root):
    gpudiag never raises its privileges, so only the OS's ptrace rules decide."""
    import psutil

    me = os.geteuid()
    try:
        uid = psutil.Process(pid).uids().real
        name = psutil.Process(pid).username()
    except (psutil.Error, KeyError):
        return None
    if me == 0 or uid == me:
        return None
    return (
        f"pid {pid} belongs to user {name!r} and gpudiag runs as uid {me}; the operating "
        "system does not let one user read another user's process (run gpudiag as that "
        "user, or as root)"
    )
