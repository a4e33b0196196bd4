"""SERVE001's fix applied to models/classifier: Triton's dynamic batcher hands execute() the
requests in flight, run as one forward (their inputs concatenated, the answer split)."""

import sys
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # tests/workloads
from serve_http import TinyTransformer  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)
        self.model = TinyTransformer().eval()

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "tokens").as_numpy() for r in requests]
        sizes = [len(x) for x in inputs]
        with torch.no_grad():
            labels = self.model(torch.from_numpy(np.concatenate(inputs)).long()).argmax(dim=1)
        out, i = [], 0
        for n in sizes:
            part = labels[i : i + n].numpy().astype(np.int64).reshape(-1, 1)
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("label", part)]))
            i += n
        return out
