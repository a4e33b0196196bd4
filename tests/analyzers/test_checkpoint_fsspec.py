"""Checkpoint saves through fsspec (Lightning) are checkpoint time, with their own episodes."""

from __future__ import annotations

from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.probes.stacks.pyspy_output import episode_anchor

SITE = "/venv/lib/python3.11/site-packages"
FIT = (
    "<module> (/work/train.py:30)",
    f"Trainer.fit ({SITE}/lightning/pytorch/trainer/trainer.py:538)",
    f"_FitLoop.run ({SITE}/lightning/pytorch/loops/fit_loop.py:205)",
)
SAVE = FIT + (
    f"ModelCheckpoint.on_train_batch_end ({SITE}/lightning/pytorch/callbacks/"
    "model_checkpoint.py:300)",
    f"ModelCheckpoint._save_checkpoint ({SITE}/lightning/pytorch/callbacks/"
    "model_checkpoint.py:390)",
    f"Trainer.save_checkpoint ({SITE}/lightning/pytorch/trainer/trainer.py:1365)",
    f"TorchCheckpointIO.save_checkpoint ({SITE}/lightning/fabric/plugins/io/torch_io.py:58)",
    f"_atomic_save ({SITE}/lightning/fabric/utilities/cloud_io.py:90)",
)
WRITE = SAVE + (f"LocalFileOpener.write ({SITE}/fsspec/implementations/local.py:420)",)
TRAIN = FIT + (f"Linear.forward ({SITE}/torch/nn/modules/linear.py:125)",)


def test_the_fsspec_write_after_serialisation_is_checkpoint_time():
    clf = Classifier()
    assert clf.category(";".join(WRITE), "f.write(bytesbuffer.getvalue())") == "checkpoint"
    assert clf.category(";".join(TRAIN), "") != "checkpoint"


def test_a_save_inside_trainer_fit_is_its_own_episode_at_the_save_callback():
    a_write = episode_anchor(WRITE)
    a_train = episode_anchor(TRAIN)
    assert a_write is not None and a_write != a_train
    assert a_write.endswith(
        f"ModelCheckpoint._save_checkpoint ({SITE}/lightning/pytorch/callbacks/model_checkpoint.py)"
    )
    assert Classifier().category(a_write) == "checkpoint"
