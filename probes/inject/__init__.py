"""Files placed first on a launched job's PYTHONPATH: sitecustomize and the hooks it loads.

These modules run inside the job and import nothing from gpudiag, so they work in any
environment the job uses.
"""
