"""A gunicorn config serving serve_flask.py's app (`serve_flask:app`: a Flask model server
written as Flask's docs write one, the small transformer, one forward per request on the
request's thread, autograd on) with gunicorn's own workers, on 127.0.0.1 only:

    gunicorn -c serve_gunicorn.py -w 2 serve_flask:app                         # sync workers
    gunicorn -c serve_gunicorn.py -w 2 -k gthread --threads 2 serve_flask:app  # gthread
    gunicorn -c serve_gunicorn.py -w 2 -k uvicorn.workers.UvicornWorker serve_fastapi:app

gunicorn's defaults otherwise (the app imported by each worker after the fork, no
--preload; gunicorn's command line wins over this file). Set by the environment, as a
deployment's config is: SERVE_PORT_FILE (the port, a free one, written there once every
worker is ready), SERVE_SECONDS (the master stops itself after that long: SIGTERM, gunicorn's
graceful stop), SERVE_ARGS (serve_flask.py's flags for each worker: `--inference-mode`,
`--batching`, `--healthy`, `--tokenize`) and SERVE_INSTRUMENT=1 (the master calls gpudiag's
instrument() as it reads this file: the hooks are forked into the workers, for
`gpudiag attach MASTER_PID`).
"""

import glob
import os
import shlex
import signal
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
pythonpath = HERE
bind = ["127.0.0.1:0"]
workers = 2
loglevel = "warning"
graceful_timeout = 5

if os.environ.get("SERVE_INSTRUMENT") == "1":
    from gpudiag.probes.hooks import instrument

    instrument()


def when_ready(server) -> None:
    """The master listens: the timer that stops it."""
    seconds = float(os.environ.get("SERVE_SECONDS", "30"))
    stop = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
    stop.daemon = True
    stop.start()


def post_worker_init(worker) -> None:
    """Each worker, its app loaded: serve_flask.py's variant from SERVE_ARGS; the port to the
    port file once every worker is ready (a worker importing torch takes seconds on a busy
    box, and a load started before would time gunicorn's start-up)."""
    serve_flask = sys.modules.get("serve_flask")
    if serve_flask is not None:
        serve_flask.configure(serve_flask.parse_args(shlex.split(os.environ.get("SERVE_ARGS", ""))))
    elif "torch" in sys.modules:  # another app (serve_fastapi:app under uvicorn's workers)
        sys.modules["torch"].set_num_threads(1)
    port_file = os.environ.get("SERVE_PORT_FILE")
    if not port_file:
        return
    open(f"{port_file}.ready-{os.getpid()}", "w").close()
    if len(glob.glob(glob.escape(port_file) + ".ready-*")) >= worker.cfg.workers:
        tmp = f"{port_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(str(worker.sockets[0].getsockname()[1]))
        os.replace(tmp, port_file)
