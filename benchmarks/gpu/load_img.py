"""Clients in parallel: POST one JPEG to /predict (multipart, as `requests` does) for --seconds;
print requests/s and latency percentiles over the steady part (after --warm seconds)."""

import argparse
import io
import threading
import time

import requests
from PIL import Image

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, default=5000)
ap.add_argument("--clients", type=int, default=16)
ap.add_argument("--seconds", type=float, default=20)
ap.add_argument("--warm", type=float, default=4)
ap.add_argument("--wait-up", type=float, default=120)
a = ap.parse_args()
buf = io.BytesIO()
Image.new("RGB", (320, 240), (120, 80, 40)).save(buf, "JPEG")
img = buf.getvalue()
url = f"http://127.0.0.1:{a.port}/predict"
t_end = time.time() + a.wait_up
while True:
    try:
        requests.post(url, files={"file": ("x.jpg", img)}, timeout=60)
        break
    except Exception:
        if time.time() > t_end:
            raise SystemExit("server never came up") from None
        time.sleep(0.5)
lat = []
lock = threading.Lock()
t0 = time.time()
t_warm, t_stop = t0 + a.warm, t0 + a.warm + a.seconds


def client():
    s = requests.Session()
    while True:
        t = time.time()
        if t > t_stop:
            return
        s.post(url, files={"file": ("x.jpg", img)}, timeout=60)
        if t >= t_warm:
            with lock:
                lat.append(time.time() - t)


ts = [threading.Thread(target=client) for _ in range(a.clients)]
for t in ts:
    t.start()
for t in ts:
    t.join()
lat.sort()
n = len(lat)
print(
    f"REQS {n} REQ_PER_S {n / a.seconds:.2f} P50_MS {1e3 * lat[n // 2]:.1f} "
    f"P99_MS {1e3 * lat[int(n * 0.99)]:.1f}",
    flush=True,
)
