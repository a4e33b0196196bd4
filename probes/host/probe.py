"""Host probe: CPU per core, I/O wait, pressure stall information (PSI), memory and swap."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import psutil

from gpudiag.probes.base import Field, Probe, ProbeStatus, Sample, Target, now_ns
from gpudiag.probes.files import descendants

PSI_ROOT = Path("/proc/pressure")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_psi(text: str) -> dict[str, int]:
    """Parse a PSI file into cumulative stall totals in microseconds: {'some': us, 'full': us}."""
    totals: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        kind = parts[0]
        for item in parts[1:]:
            if item.startswith("total="):
                totals[kind] = int(item.split("=", 1)[1])
    return totals


def cgroup_dir(pid: int, root: Path = CGROUP_ROOT) -> Path | None:
    """The cgroup v2 directory of a process, or None when it has none (cgroup v1, no access)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip().lstrip("/")
            path = root / rel if rel else root
            return path if path.is_dir() else None
    return None


class BoxScan:
    """Every process's name and CPU seconds at one time, shared by the sessions of one
    gpudiag (`watch` runs one host probe per job): a scan younger than the age asked for is
    reused, so watch's cost of looking at the other processes does not grow with its jobs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[int, dict[int, tuple[str, float]]] | None = None

    def get(self, max_age_s: float) -> tuple[int, dict[int, tuple[str, float]]]:
        """(when, {pid: (name, CPU seconds)}), scanned now unless one is young enough."""
        with self._lock:
            t = now_ns()
            if self._last is not None and 0 <= (t - self._last[0]) / 1e9 < max_age_s:
                return self._last
            cur: dict[int, tuple[str, float]] = {}
            for p in psutil.process_iter(["pid", "name", "cpu_times"]):
                ct = p.info.get("cpu_times")
                if ct is not None:
                    cur[p.info["pid"]] = (p.info.get("name") or "?", ct.user + ct.system)
            self._last = (t, cur)
            return self._last


BOX_SCAN = BoxScan()


class HostRead:
    """The box's per-core CPU times, memory and swap at one time, shared as BoxScan is: each
    of watch's sessions read the same box-wide figures every tick (8 jobs: 8 reads of
    /proc/stat, /proc/meminfo and /proc/vmstat a second); one younger than the age asked
    for is reused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[int, Any, Any, Any] | None = None

    def get(self, max_age_s: float) -> tuple[int, Any, Any, Any]:
        """(when, per-core CPU times, virtual memory, swap), read now unless young enough."""
        with self._lock:
            t = now_ns()
            if self._last is not None and 0 <= (t - self._last[0]) / 1e9 < max_age_s:
                return self._last
            self._last = (
                t,
                psutil.cpu_times(percpu=True),
                psutil.virtual_memory(),
                psutil.swap_memory(),
            )
            return self._last


HOST_READ = HostRead()


class HostProbe(Probe):
    """Samples host-wide CPU, iowait, PSI and memory; and the target's cgroup PSI when present."""

    name = "host"
    interval_s = 1.0
    fields = (
        Field("cpu_util", "ratio", "gauge", "share of all CPU cores busy (user+system+irq)"),
        Field("cpu_iowait", "ratio", "gauge", "share of CPU time idle while waiting for I/O"),
        Field("cpu_count", "cores", "gauge", "logical CPU cores on the host"),
        Field("cpu_physical", "cores", "gauge", "physical CPU cores on the host (SMT apart)"),
        Field("core_util", "ratio", "gauge", "one core's busy share (label cpu)"),
        Field("psi_cpu_some", "ratio", "gauge", "share of time some task stalled on CPU"),
        Field("psi_cpu_full", "ratio", "gauge", "share of time all tasks stalled on CPU (cgroup)"),
        Field("psi_io_some", "ratio", "gauge", "share of time some task stalled on I/O"),
        Field("psi_io_full", "ratio", "gauge", "share of time all tasks stalled on I/O"),
        Field("psi_memory_some", "ratio", "gauge", "share of time some task stalled on memory"),
        Field("psi_memory_full", "ratio", "gauge", "share of time all tasks stalled on memory"),
        Field("mem_available_bytes", "bytes", "gauge", "memory available without swapping"),
        Field("mem_total_bytes", "bytes", "gauge", "physical memory"),
        Field("swap_in_bytes_per_s", "bytes/s", "gauge", "swap-in rate"),
        Field("swap_out_bytes_per_s", "bytes/s", "gauge", "swap-out rate"),
        Field(
            "other_cpu_cores",
            "cores",
            "gauge",
            "CPU of processes outside the job and gpudiag (scope others: all of them; "
            "scope other, labels pid and comm: the top ones)",
        ),
    )

    def __init__(self, interval_s: float = 1.0, others_interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.others_interval_s = others_interval_s
        self._target_pid: int | None = None
        self._server_pid: int | None = None  # a server's front end: its tree is the job's
        self._prev_others: tuple[int, dict[int, tuple[str, float]]] | None = None
        self._prev_cpu: list | None = None
        self._prev_psi: dict[tuple[str, str], tuple[int, int]] = {}
        self._prev_swap: tuple[int, int, int] | None = None
        self._psi_sources: dict[str, Path] = {}
        physical = psutil.cpu_count(logical=False)
        self._physical = float(physical) if physical else None

    def open(self, target: Target) -> ProbeStatus:
        """Find the PSI files (host and the target's cgroup); CPU and memory always work."""
        if PSI_ROOT.is_dir():
            self._psi_sources["host"] = PSI_ROOT
        cg = cgroup_dir(target.pid)
        if cg is not None and (cg / "io.pressure").exists():
            self._psi_sources["cgroup"] = cg
        self._prev_cpu = psutil.cpu_times(percpu=True)
        self._target_pid = target.pid
        self._server_pid = target.server
        self._others(now_ns())  # the first scan: CPU is counted from here
        self._read_psi(now_ns())
        swap = psutil.swap_memory()
        self._prev_swap = (now_ns(), swap.sin, swap.sout)
        if "host" not in self._psi_sources:
            return ProbeStatus(
                self.name,
                True,
                reason="PSI not available (/proc/pressure missing)",
                hint="boot a kernel >= 4.20 with psi=1 for stall metrics",
            )
        return ProbeStatus(self.name, True)

    def _read_psi(self, t_ns: int) -> dict[tuple[str, str], dict[str, float]]:
        out: dict[tuple[str, str], dict[str, float]] = {}
        for scope, base in self._psi_sources.items():
            for res in ("cpu", "io", "memory"):
                fname = base / (res if scope == "host" else f"{res}.pressure")
                try:
                    totals = parse_psi(fname.read_text())
                except (OSError, ValueError):
                    continue
                for kind, total in totals.items():
                    key = (scope, f"psi_{res}_{kind}")
                    prev = self._prev_psi.get(key)
                    self._prev_psi[key] = (t_ns, total)
                    if prev is None or t_ns <= prev[0]:
                        continue
                    share = (total - prev[1]) * 1000 / (t_ns - prev[0])
                    vals = out.setdefault((scope, res), {})
                    vals[f"psi_{res}_{kind}"] = min(1.0, max(0.0, share))
        return out

    def sample(self) -> list[Sample]:
        """One tick: host CPU and per-core shares, PSI shares since last tick, memory, swap."""
        t = now_ns()
        samples: list[Sample] = []
        read_t, cpu, vm, swap = HOST_READ.get(self.interval_s / 2)  # another session's, if young
        prev = self._prev_cpu or cpu
        self._prev_cpu = cpu
        busy_sum = iowait_sum = total_sum = 0.0
        for i, (a, b) in enumerate(zip(prev, cpu, strict=False)):
            total = sum(b) - sum(a)
            idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
            iowait = getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0)
            if total <= 0:
                continue
            busy_sum += total - idle
            iowait_sum += iowait
            total_sum += total
            samples.append(
                Sample(
                    self.name, t, {"cpu": str(i)}, {"core_util": max(0.0, (total - idle) / total)}
                )
            )
        values: dict[str, float | None] = {
            "cpu_count": float(len(cpu)),
            "cpu_physical": self._physical,
        }
        if total_sum > 0:
            values["cpu_util"] = max(0.0, busy_sum / total_sum)
            values["cpu_iowait"] = max(0.0, iowait_sum / total_sum)
        values["mem_available_bytes"] = float(vm.available)
        values["mem_total_bytes"] = float(vm.total)
        if self._prev_swap is not None and read_t > self._prev_swap[0]:
            dt = (read_t - self._prev_swap[0]) / 1e9
            values["swap_in_bytes_per_s"] = max(0.0, (swap.sin - self._prev_swap[1]) / dt)
            values["swap_out_bytes_per_s"] = max(0.0, (swap.sout - self._prev_swap[2]) / dt)
        self._prev_swap = (read_t, swap.sin, swap.sout)
        for (scope, _res), vals in self._read_psi(t).items():
            if scope == "host":
                values.update(vals)
            else:
                samples.append(Sample(self.name, t, {"scope": scope}, dict(vals)))
        samples.append(Sample(self.name, t, {}, values))
        samples += self._others(t)
        return samples

    def mine(self) -> set[int]:
        """The pids that are the job's or gpudiag's: the target's tree, a server's front end's
        tree (`Target.server`), gpudiag's own."""
        mine = {os.getpid()}
        for root in (self._target_pid, self._server_pid, os.getpid()):
            if not root:
                continue
            mine.add(root)
            mine.update(descendants(root))  # each thread's children: no scan of the box
        return mine

    def _others(self, t: int, top: int = 5) -> list[Sample]:
        """CPU of the processes outside the job (and outside gpudiag) since the last scan:
        all of them, and the top ones by pid and name (HOST002 names them)."""
        if self._prev_others is not None and (t - self._prev_others[0]) / 1e9 < (
            self.others_interval_s * 0.95
        ):
            return []
        mine = self.mine()
        scan_t, box = BOX_SCAN.get(self.others_interval_s / 2)  # another session's, if young
        cur = {pid: v for pid, v in box.items() if pid not in mine}
        prev, self._prev_others = self._prev_others, (scan_t, cur)
        if prev is None or scan_t <= prev[0]:
            return []
        dt = (scan_t - prev[0]) / 1e9
        used = [
            (pid, name, max(0.0, (cpu - prev[1][pid][1]) / dt))
            for pid, (name, cpu) in cur.items()
            if pid in prev[1]
        ]
        used.sort(key=lambda u: -u[2])
        out = [
            Sample(self.name, t, {"scope": "others"}, {"other_cpu_cores": sum(u[2] for u in used)})
        ]
        for pid, name, cores in used[:top]:
            if cores >= 0.05:
                out.append(
                    Sample(
                        self.name,
                        t,
                        {"scope": "other", "pid": str(pid), "comm": name},
                        {"other_cpu_cores": cores},
                    )
                )
        return out

    def close(self) -> None:
        """Nothing to release."""


def cpu_count() -> int:
    """Logical CPUs this process may use (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
