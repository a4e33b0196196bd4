. gpuwork/common.sh
ng_data
NG="train.py --dataset=shakespeare_char --device=cuda --compile=False --gradient_accumulation_steps=1 --log_interval=1 --batch_size=64 --block_size=256 --n_layer=6 --n_head=6 --n_embd=384 --dropout=0.2 --eval_iters=200 --max_iters=100000 --always_save_checkpoint=False --out_dir=/tmp/ng/out"
timeout 30 gpudiag run -q --duration 18 --out $R/ng3_e10.json --record $R/ng3_e10.jsonl.gz -- python3 $NG --eval_interval=10 > $R/ng3_e10.log 2>&1; pkill -f "train.py --dataset"; sleep 1
timeout 30 gpudiag run -q --duration 18 --out $R/ng3_e250.json --record $R/ng3_e250.jsonl.gz -- python3 $NG --eval_interval=250 > $R/ng3_e250.log 2>&1; pkill -f "train.py --dataset"; sleep 1
timeout 22 python3 $NG --eval_interval=250 > $R/ng3_e250.bare.log 2>&1
pack G
python3 -c "
import json
for f in ['ng3_e10','ng3_e250']:
    r=json.load(open('/tmp/r/'+f+'.json')); a=r['run'].get('agent',{})
    print(f, r['verdict']['statement'], [x['id'] for x in r['findings'][:3]], a.get('cpu_budget_cores'), a.get('cpu_cores'))
"
