"""Ray Serve, attached by stacks alone: the replica's user-code event loop thread runs its loop
in C (uvloop), so the thread's target is its innermost Python frame while it waits; a request
is handled below Ray's `UserCallableWrapper` entry points. The recording is `gpudiag attach`
to the replica of a deployment written as Ray's PyTorch guide writes one (`async def
__call__`, one forward a request; `/work/heldout6/ray_serve_app.py`, Ray 2.60, 4 clients, load
2.5 on the 2-core box). Before, the loop's waits read as requests in flight (1.1 where 0.3-0.8
were) and the verdict was "no bottleneck" over 83% "other"."""

from __future__ import annotations

from gpudiag.analyzers.measures.workload import is_handling
from tests.analyzers.recorded import replay_workload

SITE = "/usr/lib/python3.11/site-packages"
LOOP = (
    f"_bootstrap ({SITE}/../threading.py:1002);"
    f"UserCallableWrapper.__init__.<locals>._run_user_code_event_loop "
    f"({SITE}/ray/serve/_private/replica.py:3746)"
)


def test_the_replicas_idle_event_loop_is_not_a_request():
    assert not is_handling(LOOP)
    call = (
        f"{LOOP};UserCallableWrapper._call_http_entrypoint ({SITE}/ray/serve/_private/"
        "replica.py:4341);Classifier.__call__ (/srv/app.py:31)"
    )
    assert is_handling(call)
    http_util = f"{SITE}/ray/serve/_private/http_util.py"
    body = f"{LOOP};ASGIReceiveProxy.fetch_until_disconnect ({http_util}:401)"
    assert is_handling(body)


def test_a_ray_replica_attached_by_stacks_is_serve004_with_rays_fix():
    doc = replay_workload("pub_ray_serve_attach")
    assert doc["workload"]["kind"] == "server"
    top = doc["findings"][0]
    assert top["id"] == "SERVE004" and top["location"].endswith("Classifier.__call__")
    # a CPU job: the fix in a pool thread may cost the loop the GIL (from x0.55)
    assert top["speedup_kind"] == "hypothesis" and top["speedup_low"] == 0.55
    actions = top["recommendation"]["actions"]
    assert "num_replicas" in actions[0] and "Ray Serve" in actions[1]
    assert doc["metrics"]["requests_in_flight_est"] < 1.0
