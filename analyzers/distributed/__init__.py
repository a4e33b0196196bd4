"""Distributed jobs: ranks compared, stragglers, hangs, the DIST findings."""
