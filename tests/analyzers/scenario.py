"""Scripted timelines for analyzer tests: the samples a run would give, without a run."""

from __future__ import annotations

from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import Sample

SITE = "/venv/lib/python3.11/site-packages"
STD = "/usr/lib/python3.11"
LOOP = "<module> (/work/train.py:80);train (/work/train.py:40)"
CALL = (
    f"Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1775)"
    f";Module._call_impl ({SITE}/torch/nn/modules/module.py:1786)"
)
STACKS = {
    "data_wait": f"{LOOP};_BaseDataLoaderIter.__next__ ({SITE}/torch/utils/data/dataloader.py:631)"
    f";_MultiProcessingDataLoaderIter._next_data "
    f"({SITE}/torch/utils/data/dataloader.py:1329)"
    f";Connection.poll ({STD}/multiprocessing/connection.py:257)"
    f";wait ({STD}/multiprocessing/connection.py:947)",
    "forward": f"{LOOP};Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
    f";Net.forward (/work/model.py:20)",
    "backward": f"{LOOP};Tensor.backward ({SITE}/torch/_tensor.py:522)"
    f";backward ({SITE}/torch/autograd/__init__.py:266)",
    "optimizer": f"{LOOP};SGD.step ({SITE}/torch/optim/sgd.py:80)",
    "checkpoint": f"{LOOP};save_ckpt (/work/train.py:60);save ({SITE}/torch/serialization.py:628)",
    "other": f"{LOOP};log_metrics (/work/train.py:70)",
    "sync": f"{LOOP};Tensor.item ({SITE}/torch/_tensor.py:1000)"
    f";synchronize ({SITE}/torch/cuda/__init__.py:985)",
    # calls the loop makes each step that no frame rule places (issue 39's causes)
    "post": f"{LOOP};push_metrics (/work/train.py:70);urlopen ({STD}/urllib/request.py:215)"
    f";OpenerDirector.open ({STD}/urllib/request.py:519)"
    f";SocketIO.readinto ({STD}/socket.py:706)",
    "log_tensor": f"{LOOP};debug ({STD}/logging/__init__.py:1465)"
    f";Logger._log ({STD}/logging/__init__.py:1634)"
    f";Tensor.__repr__ ({SITE}/torch/_tensor.py:431)"
    f";_str ({SITE}/torch/_tensor_str.py:697)",
    "gc": (f"{LOOP}", "gc.collect()"),
    # a GPT's forward as py-spy 0.4 names its frames (issue 55, plain attach): the loop's
    # model(x) at train.py:40, the head called at model.py:88, an attention layer's projection
    # at model.py:30 in every block, the model's own code at model.py:85; a layer of a
    # Sequential; the model under DistributedDataParallel
    "lm_head": f"{LOOP};{CALL};GPT.forward (/work/model.py:88);{CALL}"
    f";Linear.forward ({SITE}/torch/nn/modules/linear.py:125)",
    "c_attn": f"{LOOP};{CALL};GPT.forward (/work/model.py:80);{CALL}"
    f";Block.forward (/work/model.py:50);{CALL};CausalSelfAttention.forward (/work/model.py:30)"
    f";{CALL};Linear.forward ({SITE}/torch/nn/modules/linear.py:125)",
    "gpt_own": (f"{LOOP};{CALL};GPT.forward (/work/model.py:85)", "x = tok + pos"),
    # the model's own code in a helper its forward calls, and in a comprehension of its own
    "gpt_helper": f"{LOOP};{CALL};GPT.forward (/work/model.py:84)"
    ";positional_table (/work/model.py:12)",
    "gpt_listcomp": f"{LOOP};{CALL};GPT.forward (/work/model.py:86);<listcomp> (/work/model.py:86)",
    # the same under the hooks: torch calls the forward through its hooks' `inner`
    "gpt_listcomp_hooked": f"{LOOP};{CALL}"
    f";Module._call_impl.<locals>.inner ({SITE}/torch/nn/modules/module.py:1832)"
    ";GPT.forward (/work/model.py:86);GPT.forward.<locals>.<listcomp> (/work/model.py:86)",
    "seq_linear": f"{LOOP};{CALL};Sequential.forward ({SITE}/torch/nn/modules/container.py:250)"
    f";{CALL};Linear.forward ({SITE}/torch/nn/modules/linear.py:125)",
    "ddp_head": f"{LOOP};{CALL}"
    f";DistributedDataParallel.forward ({SITE}/torch/nn/parallel/distributed.py:1640)"
    f";DistributedDataParallel._run_ddp_forward ({SITE}/torch/nn/parallel/distributed.py:1460)"
    f";{CALL};GPT.forward (/work/model.py:88);{CALL}"
    f";Linear.forward ({SITE}/torch/nn/modules/linear.py:125)",
    "adam_step": f"{LOOP};Optimizer.profile_hook_step.<locals>.wrapper ({SITE}/torch/optim"
    f"/optimizer.py:485);Adam.step ({SITE}/torch/optim/adam.py:220)",
    # a sample py-spy could not read: no frame at all (a busy box's loop thread)
    "unreadable": "",
    # LitServe's front end waiting on its shutdown event (a Manager's proxy) while its
    # workers serve; a main thread joined on its worker threads
    "front_wait": "<module> (/work/serve.py:101);main (/work/serve.py:99)"
    f";LitServer.run ({SITE}/litserve/server.py:1519);wait (<string>:2)"
    f";BaseProxy._callmethod ({STD}/multiprocessing/managers.py:822)"
    f";_ConnectionBase.recv ({STD}/multiprocessing/connection.py:250)"
    f";Connection._recv ({STD}/multiprocessing/connection.py:395)",
    # a sleep the loop makes itself (the job's own line); LitServe's front end polling its
    # starting workers ("front_poll")
    "sleep": (f"{LOOP};throttle (/work/train.py:66)", "time.sleep(0.05)"),
    "front_poll": (
        "<module> (/work/serve.py:101);main (/work/serve.py:99)"
        f";LitServer.run ({SITE}/litserve/server.py:1500)",
        "time.sleep(0.5)",
    ),
    "joined": f"{LOOP};Thread.join ({STD}/threading.py:1112)"
    f";Thread._wait_for_tstate_lock ({STD}/threading.py:1132)",
    # the job's own per-step Python that is not input loading (issue 55): a metric over a
    # window reduced again each step, a structure rebuilt; and an input step done inline
    "metric": (f"{LOOP};rolling_auc (/work/train.py:90)", "ranked = sorted(window)"),
    "rebuild": (f"{LOOP};snapshot (/work/train.py:95)", "ema = copy.deepcopy(model)"),
    "tokenize": (f"{LOOP};tokenize (/work/train.py:99)", "words = text.lower().split()"),
    # autograd anomaly detection's stack record: torch's C++ calls torch.fx.traceback's
    # format_stack from the op's frame (DEBUG001); the same call from fx's tracer or from the
    # job's own code is no record
    "anomaly": f"{LOOP};Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
    f";Linear.forward ({SITE}/torch/nn/modules/linear.py:125)"
    f";format_stack ({SITE}/torch/fx/traceback.py:510)"
    f";format_list ({STD}/traceback.py:39)",
    "fx_trace": f"{LOOP};trace (/work/train.py:30)"
    f";TracerBase.create_proxy ({SITE}/torch/fx/proxy.py:200)"
    f";format_stack ({SITE}/torch/fx/traceback.py:510)",
    "user_traceback": f"{LOOP};where_am_i (/work/train.py:90)"
    f";format_stack ({STD}/traceback.py:213)",
    # a model loaded inside the loop (an embed() that loads it, a target network's weights
    # put in): its modules built under torch/nn/modules are no forward
    "load": f"{LOOP};embed (/work/train.py:12)"
    f";_BaseAutoModelClass.from_pretrained ({SITE}/transformers/models/auto/auto_factory.py:604)"
    f";Linear.__init__ ({SITE}/torch/nn/modules/linear.py:106)",
    "load_state_dict": f"{LOOP};Module.load_state_dict ({SITE}/torch/nn/modules/module.py:2500)"
    f";load ({SITE}/torch/nn/modules/module.py:2480)",
    "torch_load": f"{LOOP};read_shard (/work/train.py:15)"
    f";load ({SITE}/torch/serialization.py:1000)",
    # a loader function that builds the model from its config, then puts its weights in
    # from a state-dict file (`model.load_state_dict(torch.load(f))`), or torch.loads it whole
    "build_model": f"{LOOP};load_model (/work/train.py:30)"
    f";_BaseAutoModelClass.from_config ({SITE}/transformers/models/auto/auto_factory.py:440)"
    f";_init_weights ({SITE}/transformers/models/bert/modeling_bert.py:700)"
    f";normal_ ({SITE}/torch/nn/init.py:180)",
    "read_weights": f"{LOOP};load_model (/work/train.py:31)"
    f";load ({SITE}/torch/serialization.py:1000)",
    "put_weights": f"{LOOP};load_model (/work/train.py:31)"
    f";Module.load_state_dict ({SITE}/torch/nn/modules/module.py:2500)",
    "load_whole": f"{LOOP};load_model (/work/train.py:35)"
    f";load ({SITE}/torch/serialization.py:1000)"
    f";_load ({SITE}/torch/serialization.py:1480)",
    # one function that loads the model (line 12), runs it (14) and post-processes (16)
    "embed_forward": f"{LOOP};embed (/work/train.py:14)"
    f";Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
    f";Net.forward (/work/model.py:20)",
    "embed_post": f"{LOOP};embed (/work/train.py:16);Tensor.tolist ({SITE}/torch/_tensor.py:900)",
    # Hugging Face's generate(): each forward one decoding step
    "generate": f"{LOOP};GenerationMixin.generate ({SITE}/transformers/generation/utils.py:2400)"
    f";GenerationMixin._sample ({SITE}/transformers/generation/utils.py:3300)"
    f";Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
    f";GPT2LMHeadModel.forward ({SITE}/transformers/models/gpt2/modeling_gpt2.py:1000)",
    "json": f"{LOOP};report (/work/train.py:75);dumps ({STD}/json/__init__.py:231)"
    f";JSONEncoder.encode ({STD}/json/encoder.py:200)",
    # num_workers=0: the loop thread in the dataset's __getitem__, sleeping on a remote read
    # (a data_wait sample), or computing a transform
    "data_sleep": (
        f"{LOOP};_BaseDataLoaderIter.__next__ ({SITE}/torch/utils/data/dataloader.py:631)"
        f";_SingleProcessDataLoaderIter._next_data ({SITE}/torch/utils/data/dataloader.py:675)"
        f";_MapDatasetFetcher.fetch ({SITE}/torch/utils/data/_utils/fetch.py:51)"
        ";Remote.__getitem__ (/work/data.py:20)",
        "time.sleep(0.0005)  # the object store's latency",
    ),
    "data_compute": (
        f"{LOOP};_BaseDataLoaderIter.__next__ ({SITE}/torch/utils/data/dataloader.py:631)"
        f";_SingleProcessDataLoaderIter._next_data ({SITE}/torch/utils/data/dataloader.py:675)"
        f";_MapDatasetFetcher.fetch ({SITE}/torch/utils/data/_utils/fetch.py:51)"
        ";Collator.__call__ (/work/data.py:40)",
        "enc = tokenizer(texts, padding=True)",
    ),
}
WORKER_BUSY = (
    "_worker_loop ({SITE}/torch/utils/data/_utils/worker.py:308);"
    "fetch ({SITE}/torch/utils/data/_utils/fetch.py:51);"
    "Images.__getitem__ (/work/data.py:{line})"
).replace("{SITE}", SITE)
WORKER_IDLE = (
    f"_worker_loop ({SITE}/torch/utils/data/_utils/worker.py:290);"
    f"Queue.get ({STD}/multiprocessing/queues.py:113)"
)


class Scenario:
    """Builds a timeline window by window; all shares are of the loop thread's samples."""

    def __init__(self, cpu_count: int = 8) -> None:
        self.tl = Timeline()
        self.t0 = self.t = 1_000_000_000_000
        self.cpu_count = cpu_count

    def _times(self, n: int, step_ns: int) -> list[int]:
        """Times for n samples: spread over the windows written so far (the probes sample
        alongside py-spy), else from now on."""
        if self.t > self.t0:
            span = self.t - self.t0
            return [self.t0 + (i + 1) * span // (n + 1) for i in range(n)]
        out = []
        for _ in range(n):
            self.t += step_ns
            out.append(self.t)
        return out

    def _add_at(self, t: int, probe: str, labels: dict, values: dict) -> None:
        self.tl.add(Sample(probe, t, labels, values))

    def _add(self, probe: str, labels: dict, values: dict) -> None:
        self.tl.add(Sample(probe, self.t, labels, values))

    def window(
        self,
        shares: dict[str, float],
        ticks: int = 300,
        loop_tid: int = 100,
        worker_io: float | None = None,
        worker_busy: float = 0.0,
        workers: int = 0,
        gil_other: float = 0.0,
        saves: int = 0,
        asked_hz: float | None = None,
    ) -> Scenario:
        """One 3 s py-spy window of the loop thread (plus workers and GIL samples); `ticks`
        recorded where `asked_hz` asked for 3 s of them (default: on time, ticks / 3 s)."""
        self.t += 3_000_000_000
        for cat, share in shares.items():
            n = round(share * ticks)
            if n:
                self._add(
                    "stacks",
                    {
                        "mode": "all",
                        "kind": "stack",
                        "pid": "100",
                        "tid": str(loop_tid),
                        "thread": "MainThread",
                        "role": "target",
                        "stack": STACKS[cat][0] if isinstance(STACKS[cat], tuple) else STACKS[cat],
                        "code": STACKS[cat][1] if isinstance(STACKS[cat], tuple) else "",
                    },
                    {"count": n},
                )
        if saves:
            anchor = f"{LOOP};save_ckpt (/work/train.py:60);save ({SITE}/torch/serialization.py)"
            self._add(
                "stacks",
                {
                    "mode": "all",
                    "kind": "episode",
                    "pid": "100",
                    "tid": str(loop_tid),
                    "thread": "MainThread",
                    "anchor": anchor,
                },
                {"episodes": saves, "count": round(shares.get("checkpoint", 0) * ticks)},
            )
        for w in range(workers):
            busy = round(worker_busy * ticks)
            io = round(busy * (worker_io or 0.0))
            for stack, n in (
                (WORKER_BUSY.format(line=12), io),
                (WORKER_BUSY.format(line=15), busy - io),
                (WORKER_IDLE, ticks - busy),
            ):
                code = "raw = f.read()" if stack.endswith(":12)") else "img = augment(img)"
                if n:
                    self._add(
                        "stacks",
                        {
                            "mode": "all",
                            "kind": "stack",
                            "pid": str(200 + w),
                            "tid": str(200 + w),
                            "thread": "MainThread",
                            "role": "worker",
                            "stack": stack,
                            "code": code,
                        },
                        {"count": n},
                    )
        self._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {
                "ticks": ticks,
                "duration_s": 3.0,
                "rate_hz": ticks / 3.0 if asked_hz is None else asked_hz,
                "errors": 0,
            },
        )
        gil_ticks = ticks // 4
        if gil_other:
            self._add(
                "stacks",
                {
                    "mode": "gil",
                    "kind": "stack",
                    "pid": "100",
                    "tid": "101",
                    "thread": "metrics",
                    "role": "target",
                    "stack": "Thread.run (/usr/lib/python3.11/threading.py:982);"
                    "aggregate (/work/metrics.py:9)",
                    "code": "",
                },
                {"count": round(gil_other * gil_ticks)},
            )
        self._add(
            "stacks",
            {"mode": "gil", "kind": "window"},
            {"ticks": gil_ticks, "duration_s": 3.0, "rate_hz": 25.0, "errors": 0},
        )
        return self

    def host(
        self, cpu_util: float, iowait: float = 0.0, psi_io: float = 0.0, n: int = 10
    ) -> Scenario:
        """Host samples (one a second)."""
        for t in self._times(n, 1_000_000_000):
            self._add_at(
                t,
                "host",
                {},
                {
                    "cpu_util": cpu_util,
                    "cpu_iowait": iowait,
                    "cpu_count": float(self.cpu_count),
                    "psi_io_some": psi_io,
                },
            )
        return self

    def process(
        self,
        loop_cpu: float,
        workers: int = 0,
        worker_cpu: float = 0.0,
        worker_d: float = 0.0,
        loop_tid: int = 100,
        n: int = 10,
        read_bps: float = 0.0,
        loop_rq: float = 0.0,
        worker_rq: float | None = None,
    ) -> Scenario:
        """Process-probe samples: the loop thread's CPU share (and run-queue wait) and the
        workers' group."""
        for t in self._times(n, 200_000_000):
            self._add_at(
                t,
                "process",
                {"scope": "thread", "tid": str(loop_tid), "comm": "python"},
                {"cpu": loop_cpu, "runqueue_wait": loop_rq, "running": 1.0, "d_state": 0.0},
            )
            self._add_at(
                t,
                "process",
                {"scope": "target"},
                {"cpu_cores": loop_cpu, "procs": 1.0, "read_bytes_per_s": 0.0},
            )
            self._add_at(
                t,
                "process",
                {"scope": "workers"},
                {
                    "procs": float(workers),
                    "cpu_cores": worker_cpu,
                    "d_state_share": worker_d,
                    "read_bytes_per_s": read_bps,
                }
                | ({} if worker_rq is None else {"runqueue_cores": worker_rq}),
            )
        return self

    def python_thread(
        self, tid: int, name: str, cpu: float, samples: int = 100, rq: float = 0.0, n: int = 10
    ) -> Scenario:
        """Another Python thread of the job: py-spy's stacks of it (in an aggregator's loop)
        and its schedstat CPU share (n readings)."""
        self._add(
            "stacks",
            {
                "mode": "all",
                "kind": "stack",
                "pid": "100",
                "tid": str(tid),
                "thread": name,
                "role": "target",
                "stack": "Thread.run (/usr/lib/python3.11/threading.py:982);"
                "aggregate (/work/metrics.py:9)",
                "code": "stats[k] = stats.get(k, 0) + v",
            },
            {"count": samples},
        )
        for t in self._times(n, 200_000_000):
            self._add_at(
                t,
                "process",
                {"scope": "thread", "tid": str(tid), "comm": "python"},
                {"cpu": cpu, "runqueue_wait": rq, "running": 1.0, "d_state": 0.0},
            )
        return self

    def others(self, procs: dict[tuple[str, str], float], n: int = 10) -> Scenario:
        """Host-probe passes over the processes outside the job: {(pid, name): cores}."""
        for t in self._times(n, 1_000_000_000):
            total = sum(procs.values())
            self._add_at(t, "host", {"scope": "others"}, {"other_cpu_cores": total})
            for (pid, name), cores in procs.items():
                self._add_at(
                    t,
                    "host",
                    {"scope": "other", "pid": pid, "name": name},
                    {"other_cpu_cores": cores},
                )
        return self


# A ThreadingHTTPServer: the listener in serve_forever, each request on its own thread
SERVE_MAIN = (
    "<module> (/work/serve.py:90);serve_forever ({STD}/socketserver.py:233)"
    ";_PollSelector.select ({STD}/selectors.py:415)"
).replace("{STD}", STD)
HANDLER = (
    "Thread._bootstrap ({STD}/threading.py:1002);Thread.run ({STD}/threading.py:982)"
    ";ThreadingMixIn.process_request_thread ({STD}/socketserver.py:691)"
    ";BaseServer.finish_request ({STD}/socketserver.py:361)"
    ";BaseHTTPRequestHandler.handle ({STD}/http/server.py:436)"
    ";BaseHTTPRequestHandler.handle_one_request ({STD}/http/server.py:424)"
    ";Handler.do_POST (/work/serve.py:40)"
).replace("{STD}", STD)
HANDLER_STACKS = {
    "forward": f"{HANDLER};Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
    ";Net.forward (/work/model.py:20)",
    "json": f"{HANDLER};loads ({STD}/json/__init__.py:346)",
    "write": f"{HANDLER};_SocketWriter.write ({STD}/socketserver.py:826)",
    "tokenize": f"{HANDLER};tokenize (/work/serve.py:12)",
    # a model built in the handler: from_pretrained, its modules' __init__ under torch/nn
    "load": f"{HANDLER};predict (/work/serve.py:45)"
    f";_BaseAutoModelClass.from_pretrained ({SITE}/transformers/models/auto/auto_factory.py:604)"
    f";Linear.__init__ ({SITE}/torch/nn/modules/linear.py:106)",
}


def add_thread_stacks(
    sc: Scenario, tid: int, name: str, stacks: dict[str, float], code: str = ""
) -> None:
    """Stack samples of one thread of the job ({stack: count}, their innermost frame's
    executing line `code`) at the scenario's time."""
    for stack, n in stacks.items():
        sc._add(
            "stacks",
            {
                "mode": "all",
                "kind": "stack",
                "pid": "100",
                "tid": str(tid),
                "thread": name,
                "role": "target",
                "stack": stack,
                "code": code,
            },
            {"count": n},
        )


def server_windows(
    sc: Scenario,
    n: int = 5,
    handlers: int = 4,
    forward: float = 0.8,
    ticks: int = 300,
    tokenize: float = 0.0,
    load: float = 0.0,
) -> Scenario:
    """n 3 s windows of a threaded HTTP server: the listener waiting, and `handlers` request
    threads (new ones each window) spending `forward` of their samples in the model and
    `tokenize` in a tokenizer of the job's own; the rest half parsing JSON, half sending."""
    for w in range(n):
        sc.t += 3_000_000_000
        add_thread_stacks(sc, 100, "MainThread", {SERVE_MAIN: ticks})
        for h in range(handlers):
            tid = 1000 + w * handlers + h
            name = f"Thread-{tid} (process_request_thread)"
            rest = (1.0 - forward - tokenize - load) / 2
            counts = {
                HANDLER_STACKS["forward"]: round(forward * ticks),
                HANDLER_STACKS["json"]: round(rest * ticks),
                HANDLER_STACKS["write"]: round(rest * ticks),
                HANDLER_STACKS["tokenize"]: round(tokenize * ticks),
                HANDLER_STACKS["load"]: round(load * ticks),
            }
            add_thread_stacks(sc, tid, name, {k: v for k, v in counts.items() if v})
        sc._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {"ticks": ticks, "duration_s": 3.0, "rate_hz": 100.0, "errors": 0},
        )
    return sc


def hook_serving(
    sc: Scenario,
    seconds: float = 15.0,
    rate: float = 100.0,
    forward_s: float = 0.005,
    latency_s: float = 0.02,
    batch: float = 1.0,
    grad: float = 1.0,
    requests: bool = True,
    start_s: float = 0.0,
) -> Scenario:
    """The hooks' forwards (and requests) over `seconds` from `start_s` after the scenario's
    start: `rate` requests a second, each answered in `latency_s`; forwards of `batch`
    requests each taking `forward_s`, with autograd on when `grad`."""
    n_req = int(seconds * rate)
    step = int(1e9 / rate)
    for i in range(n_req if requests else 0):
        sc._add_at(
            sc.t0 + (i + 1) * step,
            "hooks",
            {"kind": "request"},
            {"request_latency_s": latency_s, "request_in_flight": rate * latency_s + 1},
        )
    fstep = int(step * batch)
    for i in range(int(n_req / batch)):
        sc._add_at(
            sc.t0 + int(start_s * 1e9) + (i + 1) * fstep,
            "hooks",
            {"kind": "forward"},
            {"forward_time_s": forward_s, "forward_batch": batch, "forward_grad": grad},
        )
    return sc


def hook_padding(
    sc: Scenario,
    forwards: int = 100,
    every_s: float = 0.05,
    rows: float = 32.0,
    padded: float = 256.0,
    longest: float = 40.0,
    real: float = 26.0,
    sorted_len: float | None = None,
) -> Scenario:
    """The hooks' padding rows of `forwards` attention masks, one every `every_s`: `rows`
    rows padded to `padded` tokens, each batch's longest row `longest`, a row's real tokens
    `real` (every batch alike); with `sorted_len`, a summary of the rows sorted by length
    padding to it."""
    for i in range(forwards):
        sc._add_at(
            sc.t0 + int((i + 1) * every_s * 1e9),
            "hooks",
            {"kind": "padding"},
            {
                "pad_rows": rows,
                "pad_tokens": rows * padded,
                "pad_real_tokens": rows * real,
                "pad_longest_tokens": rows * longest,
                "pad_sq_tokens": rows * padded * padded,
                "pad_longest_sq_tokens": rows * longest * longest,
            },
        )
    if sorted_len is not None:
        n = 4096.0
        sc._add_at(
            sc.t0 + int(forwards * every_s * 1e9),
            "hooks",
            {"kind": "padding_sorted"},
            {
                "pads_rows": n,
                "pads_tokens": n * sorted_len,
                "pads_sq_tokens": n * sorted_len * sorted_len,
                "pads_batch": rows,
            },
        )
    return sc


def hook_new_models(
    sc: Scenario, count: int, seconds: float = 15.0, sources: int | None = None
) -> Scenario:
    """The hooks' rows of `count` top modules forwarding for the first time over `seconds`;
    with `sources`, loaded from that many places in turn (1: the same model again and again;
    `count`: each a different one); without, from places the hooks did not know."""
    for i in range(count):
        values = {"model_new": 1.0}
        if sources is not None:
            values |= {"model_known": 1.0, "model_repeat": float(i >= sources)}
        sc._add_at(sc.t0 + int((i + 1) * seconds / count * 1e9), "hooks", {"kind": "model"}, values)
    return sc
