# sourced by the device drivers
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
G=$PWD/gpuwork
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch,sys;print(sys.version, torch.__version__)" >> $R/gpu.txt
pack() { tar czf $OUT/$1.tgz -C $R . 2>/dev/null; }
serve() { # serve NAME LOOKSPEC ARGS... : LOOKSPEC = bare|run|attach
  local name=$1 look=$2; shift 2
  local port=$((5100 + RANDOM % 800))
  if [ $look = run ]; then
    timeout 60 gpudiag run -q --duration 22 --out $R/$name.json --record $R/$name.jsonl.gz -- python3 $G/flask_serve.py --port $port "$@" > $R/$name.out 2>&1 &
    local gp=$!
  else
    timeout 60 python3 $G/flask_serve.py --port $port "$@" > $R/$name.out 2>&1 &
  fi
  timeout 50 python3 $G/load_img.py --port $port --clients 16 --warm 4 --seconds 14 > $R/$name.load 2>&1 &
  local lp=$!
  if [ $look = attach ]; then
    sleep 9; local spid=$(pgrep -f "^python3 $G/flask_serve.py --port $port" | head -1)
    timeout 40 gpudiag attach $spid -q --duration 10 --out $R/$name.json --record $R/$name.jsonl.gz > $R/$name.attach 2>&1
  fi
  wait $lp
  [ $look = run ] && wait $gp
  pkill -f "flask_serve.py --port $port"; sleep 1; pkill -9 -f "flask_serve.py --port $port"
  wait 2>/dev/null
  echo "$name $(cat $R/$name.load | tail -1)" >> $R/summary.txt
}
ng_data() { # karpathy/nanoGPT's train.py in /tmp/ng, on random shakespeare_char tokens
  mkdir -p /tmp/ng/data/shakespeare_char && cp $G/nanogpt/*.py /tmp/ng/ && cd /tmp/ng && python3 -c "
import numpy as np, pickle
r=np.random.default_rng(0)
r.integers(0,65,2_000_000,dtype=np.uint16).tofile('data/shakespeare_char/train.bin')
r.integers(0,65,200_000,dtype=np.uint16).tofile('data/shakespeare_char/val.bin')
pickle.dump({'vocab_size':65},open('data/shakespeare_char/meta.pkl','wb'))"
}
