"""A Triton Python backend model as the python_backend README's example writes one:
`TritonPythonModel.execute(requests)` looping over the requests, one forward each. The
model is the planted server's small transformer (tests/workloads/serve_http.py)."""

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
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "tokens").as_numpy()
            with torch.no_grad():
                label = self.model(torch.from_numpy(tokens).long()).argmax(dim=1).numpy()
            out = pb_utils.Tensor("label", label.astype(np.int64).reshape(-1, 1))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
