"""LLMEngine: owns the model, the KV cache and the scheduler; `step()` runs one iteration.

    step():  schedule -> execute -> sample -> update

Requests can be added and aborted between any two steps (iteration-level batching).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from pagedrt.config import EngineConfig
from pagedrt.engine.detokenizer import IncrementalDetokenizer
from pagedrt.engine.model_runner import ModelRunner
from pagedrt.engine.profiling import StepClock
from pagedrt.engine.request import Request, RequestStatus
from pagedrt.engine.sampler import Sampler, SamplingRow
from pagedrt.engine.scheduler import Scheduler
from pagedrt.kv.kv_cache import KVCache, kv_bytes_per_block, num_blocks_for_budget
from pagedrt.kv.kv_cache_manager import KVCacheManager
from pagedrt.models.loader import load_model
from pagedrt.outputs import CompletionOutput, RequestOutput
from pagedrt.sampling_params import SamplingParams

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16}


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!s} but CUDA is not available; use device='cpu'")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """"auto" is bfloat16 on CUDA and float32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r}; use 'auto' or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


class LLMEngine:
    def __init__(
        self,
        model: str | None = None,
        config: EngineConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "auto",
        loaded=None,
    ) -> None:
        self.config = config = config or EngineConfig()
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        loaded = loaded or load_model(model, self.dtype, self.device)
        self.model, self.model_config, self.tokenizer = (
            loaded.model, loaded.model_config, loaded.tokenizer)
        self.model_path = loaded.model_path
        mc = self.model_config
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        if self.max_model_len > mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's "
                f"max_position_embeddings={mc.max_position_embeddings}"
            )
        backend = config.attention_backend
        num_blocks = num_blocks_for_budget(mc, config, self.dtype, self.device)
        per_block = kv_bytes_per_block(mc, config.block_size, self.dtype)
        num_cpu_blocks = (
            config.swap_space_bytes // per_block if config.preemption_mode == "swap" else 0)
        self.kv_manager = KVCacheManager(
            num_blocks, config.block_size, config.enable_prefix_caching, num_cpu_blocks
        )
        self.kv_cache = KVCache(
            mc, num_blocks, config.block_size, num_cpu_blocks, self.dtype, self.device, backend
        )
        self.scheduler = Scheduler(config, self.kv_manager)
        self.model_runner = ModelRunner(
            self.model, self.kv_cache, self.kv_manager, self.device, backend,
            max_num_seqs=config.max_num_seqs, max_model_len=self.max_model_len,
            use_cuda_graphs=not config.enforce_eager)
        self.sampler = Sampler()
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.eos_token_ids = tuple(mc.eos_token_ids)
        if (not self.eos_token_ids and self.tokenizer is not None
                and self.tokenizer.eos_token_id is not None):
            self.eos_token_ids = (self.tokenizer.eos_token_id,)
        self.requests: dict[str, Request] = {}  # request_id -> first sequence of the group
        self.last_scheduler_output = None  # the plan of the latest step (tests inspect it)
        self.clock = StepClock(self.device)
        self.counters = {"num_steps": 0, "num_prompt_tokens": 0, "num_generated_tokens": 0,
                         "num_finished_requests": 0, "busy_time_s": 0.0}

    # ----------------------------------------------------------------- requests
    def tokenize(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass prompts as lists of token ids")
        return self.tokenizer.encode(prompt)

    def add_request(
        self,
        request_id: str,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        stream: bool = True,
    ) -> Request:
        """Validate and queue a request. Raises ValueError (nothing queued) on bad input.

        stream: step() reports this request every time it advances, with `delta_text`; when
        False it is reported only once finished, and (without stop strings) detokenized once
        at the end, which saves host time per step.
        """
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
                f"sampling params must be a SamplingParams, got {type(params)}")
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        text = prompt if isinstance(prompt, str) else None
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty; give at least one token")
            token_ids = self.tokenize(prompt)
        else:
            token_ids = list(prompt)
        self.validate_prompt(token_ids, params)
        req = Request(request_id, token_ids, params, text, priority, self.eos_token_ids)
        req.stream = stream
        self._init_sequence(req, 0)
        self.requests[request_id] = req
        self.scheduler.add_request(req)
        return req

    def validate_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        n = len(token_ids)
        if n == 0:
            raise ValueError("prompt is empty; give at least one token")
        vocab = self.model_config.vocab_size
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab
               for t in token_ids):
            bad = next(t for t in token_ids
                       if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab)
            raise ValueError(f"prompt token id {bad!r} is not an int in [0, {vocab})")
        if n > self.max_model_len:
            raise ValueError(
                f"prompt has {n} tokens, more than max_model_len={self.max_model_len}; "
                "shorten it or raise max_model_len"
            )
        if n + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) = "
                f"{n + params.max_tokens} exceeds max_model_len={self.max_model_len}; "
                "lower max_tokens or shorten the prompt"
            )
        need = self.kv_manager.blocks_for(n + params.max_tokens)
        if need > self.kv_manager.num_blocks:
            raise ValueError(
                f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) needs {need} KV blocks "
                f"but the whole cache has {self.kv_manager.num_blocks} blocks of "
                f"{self.kv_manager.block_size} tokens; lower max_tokens or enlarge the KV cache"
            )

    def _init_sequence(self, req: Request, sample_index: int) -> None:
        req.sample_index = sample_index
        if req.params.seed is not None:
            g = torch.Generator(device=self.device)
            req.generator = g.manual_seed(req.params.seed + sample_index)
        if self.tokenizer is not None:
            req.detokenizer = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids,
                                                     req.params)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request (all its samples) and free its blocks; False if unknown."""
        head = self.requests.pop(request_id, None)
        if head is None:
            return False
        for seq in head.group:
            if not seq.is_finished:
                self.scheduler.finish(seq, RequestStatus.FINISHED_ABORTED)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ----------------------------------------------------------------- the step
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> execute -> sample -> update. Returns an output for every
        streamed request that advanced and every request that finished."""
        clock = self.clock.start()
        sched = self.last_scheduler_output = self.scheduler.schedule()
        if not sched:
            return []
        clock.mark("schedule")
        logits, sampled = self.model_runner.execute(sched, clock)
        num_prompt_tokens = self._advance(sched)
        logits, sampled = self._fork_groups(logits, sampled)
        rows = [SamplingRow(r.params, r.generator, r.prompt_token_ids, r.output_token_ids,
                            r.eos_token_ids) for r in sampled]
        result = self.sampler(logits, rows, self.generator) if sampled else None
        clock.mark("sample")
        outputs = self._update(sampled, result)
        clock.mark("update")
        self.counters["num_steps"] += 1
        self.counters["num_prompt_tokens"] += num_prompt_tokens
        self.counters["busy_time_s"] += clock.total()
        return outputs

    def _advance(self, sched) -> int:
        """Count the scheduled tokens as computed; returns how many were prompt (prefill)
        tokens rather than decodes of the last sampled token."""
        num_decode = 0
        for req, num_new in zip(sched.requests, sched.num_new_tokens):
            if (num_new == 1 and req.num_output_tokens
                    and req.num_computed_tokens == req.num_tokens - 1):
                num_decode += 1
            req.num_computed_tokens += num_new
        return sched.total_num_tokens - num_decode

    def _fork_groups(self, logits: torch.Tensor, sampled: list[Request]):
        """A request with n > 1 whose prefill just completed becomes n sequences sharing its
        blocks; each samples its own first token from the same logits row."""
        if all(r.forked for r in sampled):
            return logits, sampled
        rows, seqs = [], []
        for i, req in enumerate(sampled):
            rows.append(i)
            seqs.append(req)
            if req.forked:
                continue
            req.forked = True
            for k in range(1, req.params.n):
                child = Request(f"{req.request_id}#{k}", req.prompt_token_ids, req.params,
                                req.prompt, req.priority, req.eos_token_ids, req.arrival_time)
                child.forked = True
                child.stream = req.stream
                child.arrival_seq = req.arrival_seq
                child.group = req.group
                req.group.append(child)
                self._init_sequence(child, k)
                self.kv_manager.fork(req, child)
                child.status = RequestStatus.RUNNING
                self.scheduler.running.insert(self.scheduler.running.index(req) + k, child)
                rows.append(i)
                seqs.append(child)
        return logits[torch.tensor(rows, device=logits.device)], seqs

    def _update(self, sampled: list[Request], result) -> list[RequestOutput]:
        now = time.monotonic()
        token_ids = result.token_ids.tolist() if result is not None else []
        touched: dict[str, Request] = {}
        for i, (req, token) in enumerate(zip(sampled, token_ids)):
            req.output_token_ids.append(token)
            if result.logprobs is not None and result.logprobs[i] is not None:
                req.output_logprobs.append(result.logprobs[i])
            if req.first_token_time is None:
                req.first_token_time = now
            req.last_token_time = now
            self.counters["num_generated_tokens"] += 1
            status = self._check_stop(req, token)
            if status is not None:
                self.scheduler.finish(req, status)
                if req.detokenizer is not None and not (req.stream or req.params.stop):
                    req.detokenizer.update(req.output_token_ids)  # detokenize once, at the end
            head = req.group[0]
            if head.stream or (status is not None and all(s.is_finished for s in head.group)):
                touched[head.request_id] = head
        return [self._make_output(head) for head in touched.values()]

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        p = req.params
        stop_string = None
        if req.detokenizer is not None and (req.stream or p.stop):
            stop_string = req.detokenizer.update([token])
        if req.num_output_tokens >= p.min_tokens:
            if not p.ignore_eos and token in req.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in p.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
            if stop_string is not None:
                req.stop_reason = stop_string
                return RequestStatus.FINISHED_STOPPED
        if req.num_output_tokens >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _make_output(self, head: Request) -> RequestOutput:
        outs = []
        for seq in head.group:
            done = seq.is_finished
            delta = ""
            text = ""
            if seq.detokenizer is not None:
                delta = seq.detokenizer.get_delta(done)
                text = seq.detokenizer.output_text
            outs.append(CompletionOutput(
                index=seq.sample_index, text=text, token_ids=list(seq.output_token_ids),
                finish_reason=seq.status.value if done else None, stop_reason=seq.stop_reason,
                logprobs=list(seq.output_logprobs) if seq.params.logprobs is not None else None,
                delta_text=delta,
            ))
        finished = head.forked and all(s.is_finished for s in head.group)
        if finished:
            self.requests.pop(head.request_id, None)
            self.counters["num_finished_requests"] += 1
        return RequestOutput(
            request_id=head.request_id, prompt=head.prompt,
            prompt_token_ids=head.prompt_token_ids, outputs=outs, finished=finished,
            num_cached_tokens=head.num_cached_tokens,
            metrics={"arrival_time": head.arrival_time, "first_token_time": head.first_token_time,
                     "last_token_time": head.last_token_time},
        )

    # ----------------------------------------------------------------- stats
    def stats(self) -> dict:
        """KV block usage, prefix cache, fragmentation, scheduling and throughput counters."""
        live = [r for r in self.scheduler.running]
        s = self.kv_manager.usage(live)
        c = dict(self.counters)
        busy = c["busy_time_s"] or float("nan")
        c["prompt_tokens_per_s"] = c["num_prompt_tokens"] / busy
        c["generation_tokens_per_s"] = c["num_generated_tokens"] / busy
        s.update(c)
        sch = self.scheduler
        s.update({
            "num_running": len(sch.running), "num_waiting": len(sch.waiting),
            "num_swapped": len(sch.swapped), "peak_batch_size": sch.peak_num_running,
            "peak_used_blocks": sch.peak_num_used_blocks,
            "num_preemptions": sum(sch.num_preemptions.values()),
            "num_preemptions_recompute": sch.num_preemptions["recompute"],
            "num_preemptions_swap": sch.num_preemptions["swap"],
            "num_chunked_prefill_steps": sch.num_chunked_prefill_steps,
        })
        return s

    def check_integrity(self) -> None:
        """Assert the block manager's invariants (see shared/DESIGN.md)."""
        self.kv_manager.check_integrity()
