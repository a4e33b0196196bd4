"""Rank discovery from process environments: below a launcher, and siblings of one rank."""

from __future__ import annotations

from gpudiag.probes.dist.ranks import rank_of_env


def test_torchrun_environment_names_the_rank_and_its_gpu():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": "2,6"}
    r = rank_of_env(env, 99, host="node7")
    assert (r.rank, r.local_rank, r.world_size, r.gpu, r.host) == (3, 1, 8, "6", "node7")


def test_slurm_environment_and_no_rank():
    r = rank_of_env({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16"}, 1)
    assert (r.rank, r.local_rank, r.world_size) == (5, 1, 16)
    assert r.job is None or r.job.startswith("slurm:") or r.job.startswith("rdzv:")
    assert rank_of_env({"PATH": "/bin"}, 1) is None


def test_flight_recorder_is_switched_on_unless_the_user_chose():
    from gpudiag.agent.session.ranks.launch import flight_recorder_env, is_launcher

    env = flight_recorder_env({"PATH": "/bin"})
    # torch 2.13 here: the new name (the old one makes every rank warn at start)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    mine = flight_recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})
    assert mine["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0" and "TORCH_FR_BUFFER_SIZE" not in mine
    assert is_launcher(["/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"])
    assert is_launcher(["python", "-m", "torch.distributed.run", "t.py"])
    assert is_launcher(["accelerate", "launch", "t.py"])
    assert not is_launcher(["python", "train.py"])
