"""A Flask model server written as PyTorch's tutorial "Deploying PyTorch in Python via a REST
API with Flask" shows it (densenet121, one image per request, transform_image + get_prediction,
model.forward without no_grad), moved to the GPU as its users do. Weights are random (no network).

--no-grad runs the forward under torch.inference_mode() (the INFER001 fix); --batching also
queues requests to one model thread that runs up to --max-batch at once (the SERVE001 fix).
"""

import argparse
import io
import queue
import threading
import time

import torch
import torchvision.transforms as transforms
from flask import Flask, jsonify, request
from PIL import Image
from torchvision import models

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, default=5000)
ap.add_argument("--no-grad", action="store_true")
ap.add_argument("--batching", action="store_true")
ap.add_argument("--max-batch", type=int, default=32)
ap.add_argument("--max-wait-ms", type=float, default=5.0)
args = ap.parse_args()

app = Flask(__name__)
model = models.densenet121(weights=None).to("cuda")
model.eval()


def transform_image(image_bytes):
    my_transforms = transforms.Compose(
        [
            transforms.Resize(255),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    return my_transforms(image).unsqueeze(0)


def forward(batch):
    if args.no_grad or args.batching:
        with torch.inference_mode():
            return model.forward(batch.to("cuda")).max(1)[1].tolist()
    return model.forward(batch.to("cuda")).max(1)[1].tolist()


q = queue.Queue()


def batcher():
    while True:
        items = [q.get()]
        deadline = time.perf_counter() + args.max_wait_ms / 1e3
        while len(items) < args.max_batch:
            left = deadline - time.perf_counter()
            try:
                items.append(q.get(timeout=left) if left > 0 else q.get_nowait())
            except queue.Empty:
                break
        out = forward(torch.cat([t for t, _ in items]))
        for (_, slot), y in zip(items, out, strict=True):
            slot["y"] = y
            slot["ev"].set()


if args.batching:
    threading.Thread(target=batcher, daemon=True).start()


def get_prediction(image_bytes):
    tensor = transform_image(image_bytes=image_bytes)
    if args.batching:
        slot = {"ev": threading.Event()}
        q.put((tensor, slot))
        slot["ev"].wait()
        return slot["y"]
    return forward(tensor)[0]


@app.route("/predict", methods=["POST"])
def predict():
    if request.method == "POST":
        file = request.files["file"]
        img_bytes = file.read()
        class_id = get_prediction(image_bytes=img_bytes)
        return jsonify({"class_id": class_id})


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=args.port, threaded=True)
