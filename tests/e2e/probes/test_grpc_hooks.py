"""End to end: the serving hooks on grpcio's sync server (`grpc.server(ThreadPoolExecutor(...))`):
each RPC timed once from its arrival (its wait for a free pool thread included) to its answer, with
the RPCs in flight; answers and errors as the server gives them; a grpcio whose internals differ is
left alone (told from its stacks only)."""

from __future__ import annotations

import subprocess
import sys


def test_grpc_server_imported_after_the_hooks_is_patched():
    """The hooks installed first (`gpudiag run`, instrument()), grpc's server modules imported
    after (grpc.server() imports the sync one): the import watcher patches them."""
    code = (
        "import sys\n"
        "from gpudiag.probes.inject import gpudiag_serve as s\n"
        "s.install_requests(s.Recorder(lambda: None))\n"
        "assert 'grpc._server' not in sys.modules\n"
        "from concurrent import futures\n"
        "import grpc\n"
        "grpc.server(futures.ThreadPoolExecutor(1))\n"
        "assert grpc._server._gpudiag_patched\n"
        "assert grpc._server._handle_call.__module__ == s.__name__\n"
        "import grpc.aio\n"
        "assert grpc.aio._server.Server._gpudiag_patched\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
