"""Host and process probes: CPU, I/O, pressure, the target's threads and children, the box."""
