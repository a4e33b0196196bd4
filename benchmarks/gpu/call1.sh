. gpuwork/common.sh
date >> $R/summary.txt
# A: the Flask tutorial server, batch 1, 16 clients
serve flask_b1.bare bare
serve flask_b1.run1 run
serve flask_b1.run2 run
serve flask_b1.attach attach
serve flask_nograd.bare bare --no-grad
serve flask_batching.bare bare --batching
serve flask_batching.run1 run --batching
pack A
# B: sentence-transformers, one encode() per sentence
st() { timeout 90 "${@:2}" > $R/$1.out 2>&1; echo "$1 $(grep -h ITEMS_PER_S $R/$1.out | tail -1)" >> $R/summary.txt; }
python3 $G/st_embed.py --seconds 1 > $R/st_setup.out 2>&1
st st_b1.bare python3 $G/st_embed.py --seconds 14
st st_b64.bare python3 $G/st_embed.py --seconds 14 --batch-size 64
st st_b1.run1 gpudiag run -q --duration 30 --out $R/st_b1.run1.json --record $R/st_b1.run1.jsonl.gz -- python3 $G/st_embed.py --seconds 17
st st_b1.run2 gpudiag run -q --duration 30 --out $R/st_b1.run2.json --record $R/st_b1.run2.jsonl.gz -- python3 $G/st_embed.py --seconds 17
python3 $G/st_embed.py --seconds 22 > $R/st_b1.attach.job 2>&1 & jp=$!
sleep 6; timeout 30 gpudiag attach $jp -q --duration 12 --out $R/st_b1.attach.json --record $R/st_b1.attach.jsonl.gz > $R/st_b1.attach.out 2>&1; wait $jp
echo "st_b1.attach $(tail -1 $R/st_b1.attach.job)" >> $R/summary.txt
pack B
# C: nanoGPT (karpathy/nanoGPT @3adf61e, unmodified), shakespeare_char config, eval every 10 iterations
ng_data
NG="train.py --dataset=shakespeare_char --device=cuda --compile=False --log_interval=1 --batch_size=64 --block_size=256 --n_layer=6 --n_head=6 --n_embd=384 --dropout=0.2 --eval_iters=200 --max_iters=100000 --always_save_checkpoint=False --out_dir=/tmp/ng/out"
timeout 22 python3 $NG --eval_interval=10 > $R/ng_e10.bare.log 2>&1
timeout 22 python3 $NG --eval_interval=250 > $R/ng_e250.bare.log 2>&1
timeout 30 gpudiag run -q --duration 22 --out $R/ng_e10.run1.json --record $R/ng_e10.run1.jsonl.gz -- python3 $NG --eval_interval=10 > $R/ng_e10.run1.log 2>&1; pkill -f "train.py --dataset"; sleep 1
timeout 30 gpudiag run -q --duration 22 --out $R/ng_e10.run2.json --record $R/ng_e10.run2.jsonl.gz -- python3 $NG --eval_interval=10 > $R/ng_e10.run2.log 2>&1; pkill -f "train.py --dataset"; sleep 1
cd - >/dev/null
pack C
# D: right-size reference timings (bare), and a recording of the memory-bound job
cd $G/g
for j in "g_fp32.py" "g_fp32.py --tf32" "g_healthy.py" "g_membound.py" "g_starved.py"; do
  echo "$j $(timeout 40 python3 $j --seconds 10 2>&1 | grep STEPS | tail -1)" >> $R/summary.txt
done
timeout 40 gpudiag run -q --duration 14 --out $R/membound.json --record $R/membound.jsonl.gz -- python3 g_membound.py --seconds 16 > $R/membound.out 2>&1
cd - >/dev/null
date >> $R/summary.txt
pack D
cat $R/summary.txt
