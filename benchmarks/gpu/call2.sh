. gpuwork/common.sh
date >> $R/summary.txt
st() { timeout 90 "${@:2}" > $R/$1.out 2>&1; echo "$1 $(grep -h ITEMS_PER_S $R/$1.out | tail -1)" >> $R/summary.txt; }
python3 $G/st_embed.py --seconds 1 > $R/st_setup.out 2>&1
st st2_b1.run1 gpudiag run -q --duration 40 --out $R/st2_b1.run1.json --record $R/st2_b1.run1.jsonl.gz -- python3 $G/st_embed.py --seconds 24
st st2_b1.run2 gpudiag run -q --duration 40 --out $R/st2_b1.run2.json --record $R/st2_b1.run2.jsonl.gz -- python3 $G/st_embed.py --seconds 24
python3 $G/st_embed.py --seconds 24 > $R/st2_b1.attach.job 2>&1 & jp=$!
sleep 6; timeout 30 gpudiag attach $jp -q --duration 16 --out $R/st2_b1.attach.json --record $R/st2_b1.attach.jsonl.gz > $R/st2_b1.attach.out 2>&1; wait $jp
echo "st2_b1.attach $(tail -1 $R/st2_b1.attach.job)" >> $R/summary.txt
pack S
serve flask2_b1.run1 run
serve flask2_batching.run1 run --batching
pack F
ng_data
NG="train.py --dataset=shakespeare_char --device=cuda --compile=False --gradient_accumulation_steps=1 --log_interval=1 --batch_size=64 --block_size=256 --n_layer=6 --n_head=6 --n_embd=384 --dropout=0.2 --eval_iters=200 --max_iters=100000 --always_save_checkpoint=False --out_dir=/tmp/ng/out"
timeout 20 python3 $NG --eval_interval=10 > $R/ng2_e10.bare.log 2>&1
timeout 20 python3 $NG --eval_interval=250 > $R/ng2_e250.bare.log 2>&1
for k in 1 2; do timeout 30 gpudiag run -q --duration 22 --out $R/ng2_e10.run$k.json --record $R/ng2_e10.run$k.jsonl.gz -- python3 $NG --eval_interval=10 > $R/ng2_e10.run$k.log 2>&1; pkill -f "train.py --dataset"; sleep 1; done
timeout 30 gpudiag run -q --duration 22 --out $R/ng2_e250.run1.json --record $R/ng2_e250.run1.jsonl.gz -- python3 $NG --eval_interval=250 > $R/ng2_e250.run1.log 2>&1; pkill -f "train.py --dataset"
date >> $R/summary.txt
pack N
cat $R/summary.txt
