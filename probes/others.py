"""Other processes on the box: who takes the CPU the job's threads wait for (HOST002).

Read from procfs through psutil every few seconds (a pass over every process is the costly
part), as CPU-time deltas per process, the job's own process tree left out."""

from __future__ import annotations

import psutil

TOP = 5  # processes named per tick


class OtherProcesses:
    """CPU use of the processes that are not the job, as deltas between two `read()` calls."""

    def __init__(self) -> None:
        self._prev: dict[int, float] = {}
        self._prev_t: float | None = None

    def read(self, job_pids: set[int], t_s: float) -> tuple[float, list[tuple[int, str, float]]]:
        """(cores used by all other processes, the top ones as (pid, name, cores)) since the
        last call; (0.0, []) on the first call."""
        cur: dict[int, float] = {}
        names: dict[int, str] = {}
        for p in psutil.process_iter(["pid", "name", "cpu_times"]):
            info = p.info
            ct = info.get("cpu_times")
            if ct is None or info["pid"] in job_pids:
                continue
            cur[info["pid"]] = ct.user + ct.system
            names[info["pid"]] = info.get("name") or "?"
        prev, prev_t = self._prev, self._prev_t
        self._prev, self._prev_t = cur, t_s
        if prev_t is None or t_s <= prev_t:
            return 0.0, []
        dt = t_s - prev_t
        used = [
            (pid, names[pid], max(0.0, (c - prev[pid]) / dt))
            for pid, c in cur.items()
            if pid in prev
        ]
        used.sort(key=lambda x: -x[2])
        return sum(u[2] for u in used), [u for u in used[:TOP] if u[2] >= 0.05]
