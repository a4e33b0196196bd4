"""Measures of the loop: its window, thread profile, frame rules, critical path, throughput."""
