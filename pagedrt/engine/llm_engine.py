"""LLMEngine: owns the scheduler, the KV block manager and the requests, and drives the device
side (model, KV cache, sampler) through an executor; `step()` runs one iteration.

    step():  schedule -> execute -> sample -> update

`Scheduler.schedule` makes a `StepPlan`, the executor's `execute` runs it (`ModelRunner.execute`:
model and sampler, in this process or on every tensor-parallel rank,
pagedrt/distributed/executor.py), its `fetch` returns the `StepResult`, `Scheduler.update`
writes it into the requests: plan and result are plain data (docs/design.md).

Requests can be added and aborted between any two steps (iteration-level batching).

Async scheduling (on by default on CUDA): the device runs step n while the host schedules and
launches step n+1, so the host's per-step work hides behind the device's. A token sampled by
step n is not on the host when step n+1 is planned: the request gets a placeholder token
(`PLACEHOLDER_TOKEN_ID`), step n+1 reads the real id on the device, and once step n's tokens
reach the host (after step n+1 was launched) they replace the placeholders and the stop checks
run. A request that stopped at step n has computed one token too many in step n+1; that row is
dropped. Penalties need no host tokens either: the device side counts each row's sampled
tokens on the device (pagedrt/engine/sampling_state.py), so they keep the overlap.

    host:    | sched n+1 | launch n+1 | update n | sched n+2 | launch n+2 | update n+1 |
    device:  |  ... step n ...   |      step n+1       |          step n+2  ...

Speculative decoding and async scheduling: a step that verifies drafts is read back at once
(the next plan's positions depend on how many drafts were accepted), and a plan can give a
sequence drafts only once its last token is on the host. So while speculation is on (few
sequences, pagedrt/spec/config.py) the engine reads the step in flight before planning
whenever some sequence not paused by the acceptance rule (pagedrt/spec/acceptance.py) has known
tokens that already end in an n-gram match (always, with a draft model): those steps run one
after the other. Without a match the overlap stays, so text
that does not repeat itself decodes as fast as without speculation.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedrt.config import EngineConfig, resolve_multi_step
from pagedrt.core.beam import BeamGroup
from pagedrt.core.plan import StepPlan
from pagedrt.core.request import Request, RequestStatus
from pagedrt.distributed.executor import ExecutorError, RemoteStep, create_executor
from pagedrt.engine.bad_words import resolve_bad_words
from pagedrt.engine.detokenizer import IncrementalDetokenizer
from pagedrt.engine.model_runner import LaunchedStep
from pagedrt.engine.profiling import StepClock
from pagedrt.engine.scheduler import Scheduler
from pagedrt.engine.validation import (
    EngineLimits,
    check_priority,
    resolve_max_tokens,
    truncate_prompt,
    validate_prompt,
)
from pagedrt.env_flags import check_environment, env_flag
from pagedrt.kv.kv_cache import KVCacheSpec, kv_cache_torch_dtype
from pagedrt.kv.kv_cache_manager import KVCacheManager
from pagedrt.ops.attention import check_backend
from pagedrt.outputs import CompletionOutput, PromptLogprobsEvent, RequestOutput, TokenEvent
from pagedrt.sampling_params import (
    RequestOutputKind,
    SamplingParams,
    check_truncate_prompt_tokens,
)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16}


def spec_decode_stats(scheduler: Scheduler) -> dict:
    """Speculative decoding counters (vLLM's names): drafts (sequence-steps that verified
    drafts), draft and accepted tokens, acceptance rate = accepted / draft tokens, mean
    accepted length = tokens per sequence-step that verified drafts = 1 + accepted / drafts
    (the target's own token counts; an upper bound of k + 1), steps that verified drafts,
    (async scheduling) steps read back before the next plan so that it could speculate, and
    pauses of the per-sequence acceptance rule (pagedrt/spec/acceptance.py)."""
    drafts, proposed = scheduler.num_spec_drafts, scheduler.num_spec_draft_tokens
    accepted = scheduler.num_spec_accepted_tokens
    return {
        "spec_decode_num_steps": scheduler.num_spec_steps,
        "spec_decode_num_early_reads": scheduler.num_spec_early_reads,
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": proposed,
        "spec_decode_num_accepted_tokens": accepted,
        "spec_decode_acceptance_rate": accepted / proposed if proposed else 0.0,
        "spec_decode_mean_accepted_length": 1.0 + accepted / drafts if drafts else 0.0,
        "spec_decode_num_pauses": scheduler.acceptance.num_pauses,
    }


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N" as a torch.device.

    Raises:
        ValueError: another value (naming it and the accepted ones), or CUDA asked for where
            it is not available.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    asked = device
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"device={str(asked)!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} asked for, but CUDA is not available here; "
                         "use 'cpu' or 'auto' (--device cpu on the command line)")
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


@dataclass
class InFlightStep:
    """A launched step whose sampled tokens the scheduler has not written yet."""

    plan: StepPlan
    launched: LaunchedStep | RemoteStep


class LLMEngine:
    def __init__(
        self,
        model: str | None = None,
        config: EngineConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "auto",
        loaded=None,
    ) -> None:
        """model: a .gguf file, a Hugging Face folder, RandomWeights, or None (the default
        model); loaded: a LoadedModel used instead (its whole model on one device).

        Raises:
            ValueError: bad settings, an unknown model, a tensor-parallel split the model does
                not allow or a process group that cannot form (see create_executor).
        """
        check_environment()  # (a bad PAGEDRT_* value refused before the model loads)
        self.device = resolve_device(device)
        # num_scheduler_steps None (auto) decided for this device (config.resolve_multi_step)
        self.config = config = resolve_multi_step(config or EngineConfig(), self.device.type)
        check_backend(config.attention_backend, self.device)
        self.dtype = resolve_dtype(dtype, self.device)
        # the device side: one rank in this process, or tensor-parallel worker processes
        self.executor = executor = create_executor(model, loaded, config, self.dtype,
                                                   self.device)
        self.model_config = mc = executor.model_config
        self.tokenizer = executor.tokenizer
        self.model_path = executor.model_path
        self.max_model_len = executor.max_model_len
        num_blocks, num_cpu_blocks = executor.num_blocks, executor.num_cpu_blocks
        # the cache each rank holds (the ranks checked that their devices can hold it)
        self.kv_spec = KVCacheSpec.for_model(
            mc, config.block_size, kv_cache_torch_dtype(config.kv_cache_dtype, self.dtype),
            config.tensor_parallel_size)
        self.kv_manager = KVCacheManager(
            num_blocks, config.block_size, config.enable_prefix_caching, num_cpu_blocks,
            sliding_window=mc.kv_sliding_window,
        )
        self.scheduler = Scheduler(config, self.kv_manager)
        # the rank in this process, when there is one (tests and benchmarks look inside)
        local = executor.local
        self.model_runner = None if local is None else local.model_runner
        self.model = None if local is None else local.model
        self.kv_cache = None if local is None else local.kv_cache
        self.eos_token_ids = tuple(mc.eos_token_ids)
        if (not self.eos_token_ids and self.tokenizer is not None
                and self.tokenizer.eos_token_id is not None):
            self.eos_token_ids = (self.tokenizer.eos_token_id,)
        window = mc.kv_sliding_window  # blocks before it are given back as it moves
        self.limits = EngineLimits(
            mc.vocab_size, self.max_model_len, num_blocks, config.block_size,
            config.max_num_seqs, None if window is None else
            -(-(window - 1 + config.max_num_batched_tokens) // config.block_size) + 2,
            num_eos_tokens=len(self.eos_token_ids),
            enable_prefix_caching=config.enable_prefix_caching,
            max_position_embeddings=mc.max_position_embeddings,
            eos_token_ids=self.eos_token_ids)
        self.requests: dict[str, Request] = {}  # request_id -> first sequence of the group
        self.last_scheduler_output: StepPlan | None = None  # the latest plan (tests read it)
        # with the model in other processes there is no device here to synchronize with
        self.clock = StepClock(self.device if local is not None else torch.device("cpu"))
        self.async_scheduling = config.async_scheduling
        if self.async_scheduling is None:  # PAGEDRT_ASYNC_SCHEDULING=0|1 overrides the default
            env = env_flag("PAGEDRT_ASYNC_SCHEDULING")
            self.async_scheduling = self.device.type == "cuda" if env is None else env
        self.in_flight: InFlightStep | None = None  # async scheduling: the step on the device
        # None: step() reports RequestOutputs. A list (the engine-core process sets one, see
        # pagedrt/entrypoints/engine_core.py): step() appends one TokenEvent per sampled token
        # instead and returns no outputs; text is then made by the reader, and the engine
        # detokenizes only requests with stop strings (to find them).
        self.token_events: list[TokenEvent] | None = None
        # in token-event mode, where the prompt logprobs a step brings go (one
        # PromptLogprobsEvent per request and step; the engine core sets it with token_events)
        self.prompt_logprob_events: list[PromptLogprobsEvent] | None = None
        self.counters = {"num_steps": 0, "num_prompt_tokens": 0, "num_generated_tokens": 0,
                         "num_finished_requests": 0, "busy_time_s": 0.0}
        if self.device.type == "cuda":
            # Everything built so far (torch, transformers, the model) lives as long as the
            # engine: keep it out of the garbage collector's full passes, which otherwise walk
            # it while the device waits for the next step.
            gc.collect()
            gc.freeze()

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

        stream: step() reports this request every time it advances, as
        `params.output_kind` says (`RequestOutputKind`: CUMULATIVE, whole outputs with
        `delta_text` and `delta_token_ids`; DELTA, only what each output adds); when False,
        or with output_kind FINAL_ONLY, it is reported only once finished, whole, and (without
        stop strings) detokenized once at the end, which saves host time per step.
        """
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
                f"sampling params must be a SamplingParams, got {type(params)}")
        priority = check_priority(priority)
        text = prompt if isinstance(prompt, str) else None
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty; give at least one token")
            token_ids = self.tokenize(prompt)
        else:
            token_ids = list(prompt)
        token_ids, text = self.truncate_prompt(token_ids, params, text)
        params = self.resolve_bad_words(params)
        params = self.resolve_max_tokens(token_ids, params)
        self.validate_prompt(token_ids, params)
        return self.add_validated_request(request_id, token_ids, params, text, priority, stream)

    def add_validated_request(
        self,
        request_id: str,
        token_ids: list[int],
        params: SamplingParams,
        text: str | None = None,
        priority: int = 0,
        stream: bool = True,
    ) -> Request:
        """`add_request` for token ids that already passed `validate_prompt` with these params
        (LLM.generate checks every prompt before queuing any, and need not check twice).
        Raises ValueError if request_id is in use."""
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        req = Request(request_id, token_ids, params, text, priority, self.eos_token_ids)
        req.stream = stream and params.output_kind is not RequestOutputKind.FINAL_ONLY
        if params.beam_search is not None:  # reported once, when the search is done
            req.beam = BeamGroup(params.beam_search, self.eos_token_ids)
            req.stream = False
        self._init_sequence(req)
        self.requests[request_id] = req
        self.scheduler.add_request(req)
        return req

    def resolve_bad_words(self, params: SamplingParams) -> SamplingParams:
        """See `pagedrt.engine.bad_words.resolve_bad_words` (bad_words turned into token ids
        with this model's tokenizer; raises ValueError where it has none)."""
        return resolve_bad_words(params, self.tokenizer)

    def truncate_prompt(self, token_ids: list[int], params: SamplingParams,
                        text: str | None = None) -> tuple[list[int], str | None]:
        """(token ids, text) as `params.truncate_prompt_tokens` leaves them
        (`pagedrt.engine.validation.truncate_prompt`): a truncated prompt's text is its
        tokens' text (None without a tokenizer), so that `RequestOutput.prompt` matches
        `prompt_token_ids`. Raises ValueError for a bad truncate_prompt_tokens."""
        if params.truncate_prompt_tokens is None:
            return token_ids, text
        # (a value assigned after construction is checked too; the other fields are checked
        # again by `validate_prompt`)
        check_truncate_prompt_tokens(params.truncate_prompt_tokens)
        kept = truncate_prompt(token_ids, params.truncate_prompt_tokens, params.max_tokens,
                               self.limits)
        if len(kept) == len(token_ids):
            return token_ids, text
        return kept, None if self.tokenizer is None else self.tokenizer.decode(kept)

    def resolve_max_tokens(self, token_ids: list[int], params: SamplingParams) -> SamplingParams:
        """See `pagedrt.engine.validation.resolve_max_tokens` (max_tokens=None set for this
        prompt)."""
        return resolve_max_tokens(token_ids, params, self.limits)

    def validate_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        """See `pagedrt.engine.validation.validate_prompt` (raises ValueError)."""
        validate_prompt(token_ids, params, self.limits)

    def _init_sequence(self, req: Request) -> None:
        """The host-side helpers of a sequence: its incremental detokenizer (in token-event
        mode only for requests with stop strings, which the engine must find)."""
        if req.beam is not None:  # beam slots change history: text is made at the end
            return
        if self.tokenizer is not None and (self.token_events is None or req.params.stop):
            req.detokenizer = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids,
                                                     req.params)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request (all its samples) and free its blocks; False if unknown."""
        head = self.requests.pop(request_id, None)
        if head is None:
            return False
        self.scheduler.abort(head)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.in_flight is not None or self.scheduler.has_unfinished_requests()

    # ----------------------------------------------------------------- the step
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> execute -> sample -> update. Returns an output for every
        streamed request that advanced and every request that finished (whole, or only what
        it adds for a request with SamplingParams.output_kind DELTA: see `_make_output`).

        With async scheduling the update is that of the previous step, made after this one was
        launched (see the module docstring); outputs then trail the device by one step.

        Raises:
            ExecutorError: a tensor-parallel worker raised, died or hung; every request of
                the engine has been ended (aborted, its blocks freed), and every later step
                raises it again.
        """
        try:
            return self._step()
        except ExecutorError:
            self.in_flight = None
            for request_id in list(self.requests):
                self.abort_request(request_id)
            raise

    def _step(self) -> list[RequestOutput]:
        clock = self.clock.start()
        outputs: list[RequestOutput] = []
        if self.in_flight is not None and (not self.async_scheduling
                                           or self.scheduler.wants_known_tokens()):
            # drafts will follow the generated tokens: no placeholder may be left
            outputs = self._finish_step(self.in_flight)
            self.in_flight = None
        plan = self.last_scheduler_output = self.scheduler.schedule()
        for parent_id in plan.forks:  # the scheduler forked these sequences
            for child in self.requests[parent_id].group[1:]:
                self._init_sequence(child)
        clock.mark("schedule")
        step = self.executor.execute(plan, clock)  # with no request scheduled: rows only
        launched = InFlightStep(plan, step) if step is not None else None
        previous, self.in_flight = self.in_flight, launched
        if previous is not None:
            outputs += self._finish_step(previous)
        if launched is not None and (not self.scheduler.has_unfinished_requests()
                                     or not self.async_scheduling or plan.draft_token_ids):
            # read now: in sync mode; when every row belongs to a request that just stopped
            # (nothing to report, but the engine is then idle when the work is done); and
            # after a step that verified drafts (it decides where the next one starts)
            outputs += self._finish_step(launched)
            self.in_flight = None
        clock.mark("update")
        if launched is not None:
            self.counters["num_steps"] += 1
            self.counters["num_prompt_tokens"] += plan.num_prompt_tokens
        self.counters["busy_time_s"] += clock.total()
        return outputs

    def _finish_step(self, step: InFlightStep) -> list[RequestOutput]:
        """Read a launched step's tokens and hand them to the scheduler, which writes them and
        finishes the sequences that `_check_stop` stops; returns the outputs to report (none
        in token-event mode: the scheduler appended a TokenEvent per token instead)."""
        result = self.executor.fetch(step.launched)
        events = self.token_events
        heads, num_generated = self.scheduler.update(step.plan, result, self._check_stop,
                                                     events, self.prompt_logprob_events)
        self.counters["num_generated_tokens"] += num_generated
        if events is not None:
            for head in heads:  # every sample finished
                self._retire(head)
            return []
        return [self._make_output(head) for head in heads]

    def _check_stop(self, req: Request, token: int, num_output: int) -> RequestStatus | None:
        """Stop conditions after `token`, the request's `num_output`-th generated token; the
        scheduler's `update` calls it and finishes the request on a status. Advances the
        detokenizer (at the end only, for a request detokenized once)."""
        status = self._stop_status(req, token, num_output)
        if (status is not None and req.detokenizer is not None
                and not (req.stream or req.params.stop)):
            # detokenize once; a stop token's text is left out (`IncrementalDetokenizer.update`)
            req.detokenizer.update(req.output_token_ids[:num_output],
                                   stop_terminated=status is RequestStatus.FINISHED_STOPPED)
        return status

    def _stop_status(self, req: Request, token: int, num_output: int) -> RequestStatus | None:
        p = req.params
        eos = stop_id = False
        if num_output >= p.min_tokens:
            eos = not p.ignore_eos and token in req.eos_token_ids
            stop_id = not eos and token in p.stop_token_ids
        stop_string = None
        if req.detokenizer is not None and (req.stream or p.stop):
            stop_string = req.detokenizer.update([token], stop_terminated=eos or stop_id)
        if eos:
            return RequestStatus.FINISHED_STOPPED
        if stop_id:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        if num_output >= p.min_tokens and stop_string is not None:
            req.stop_reason = stop_string
            return RequestStatus.FINISHED_STOPPED
        if (num_output >= p.max_tokens
                or req.num_prompt_tokens + num_output >= self.max_model_len):
            return RequestStatus.FINISHED_LENGTH
        return None

    def _make_output(self, head: Request) -> RequestOutput:
        """The output of a request that advanced or finished: per sample, the tokens, text and
        logprobs so far (CUMULATIVE, or a request reported only once finished) or only those
        since its previous output (DELTA: no copy of the history, O(new tokens) per output).
        The prompt logprobs, where asked, are in every output, or in the first only (DELTA);
        the list is the request's own, not a copy.
        `Request.num_reported_tokens` marks where each sample's next delta starts; tokens
        still being sampled (`num_pending_tokens`) are left for a later output."""
        if head.beam is not None:
            return self._make_beam_output(head)
        delta_only = head.stream and head.params.output_kind is RequestOutputKind.DELTA
        outs = []
        for seq in head.group:
            done = seq.is_finished
            delta = ""
            text = ""
            if seq.detokenizer is not None:
                delta = seq.detokenizer.get_delta(done)
                text = delta if delta_only else seq.detokenizer.output_text
            start = seq.num_reported_tokens
            end = seq.num_output_tokens - seq.num_pending_tokens
            seq.num_reported_tokens = end
            output_token_ids = seq.output_token_ids
            new_token_ids = output_token_ids[start:end]
            logprobs = cumulative = None
            if seq.params.logprobs is not None:
                logprobs = (seq.output_logprobs[start:end] if delta_only
                            else list(seq.output_logprobs))
                cumulative = seq.cumulative_logprob
            outs.append(CompletionOutput(
                index=seq.sample_index, text=text,
                token_ids=list(new_token_ids) if delta_only else output_token_ids[:end],
                finish_reason=seq.status.value if done else None, stop_reason=seq.stop_reason,
                logprobs=logprobs, delta_text=delta, delta_token_ids=new_token_ids,
                cumulative_logprob=cumulative,
            ))
        finished = head.forked and all(s.is_finished for s in head.group)
        if finished:
            self._retire(head)
        output = self._request_output(head, outs, finished)
        if head.prompt_logprobs is not None and not (delta_only
                                                     and head.prompt_logprobs_reported):
            output.prompt_logprobs = head.prompt_logprobs  # (complete: the prompt is computed)
            head.prompt_logprobs_reported = True
        return output

    def _make_beam_output(self, head: Request) -> RequestOutput:
        """A finished beam search: its hypotheses, best first (index = rank), detokenized
        now."""
        outs = []
        for rank, hypothesis in enumerate(head.beam.finished):
            text = ""
            if self.tokenizer is not None:
                detokenizer = IncrementalDetokenizer(self.tokenizer, head.prompt_token_ids,
                                                     head.params)
                detokenizer.update(hypothesis.token_ids)
                detokenizer.get_delta(True)
                text = detokenizer.output_text
            outs.append(CompletionOutput(
                index=rank, text=text, token_ids=list(hypothesis.token_ids),
                finish_reason=hypothesis.finish_reason,
                cumulative_logprob=hypothesis.cumulative_logprob))
        self._retire(head)
        return self._request_output(head, outs, True)

    @staticmethod
    def _request_output(head: Request, outs: list[CompletionOutput],
                        finished: bool) -> RequestOutput:
        return RequestOutput(
            request_id=head.request_id, prompt=head.prompt,
            prompt_token_ids=head.prompt_token_ids, outputs=outs, finished=finished,
            num_cached_tokens=head.num_cached_tokens,
            metrics={"arrival_time": head.arrival_time, "first_token_time": head.first_token_time,
                     "last_token_time": head.last_token_time},
        )

    def _retire(self, head: Request) -> None:
        """Forget a request whose samples have all finished."""
        self.requests.pop(head.request_id, None)
        self.counters["num_finished_requests"] += 1

    # ----------------------------------------------------------------- stats
    def stats(self, detailed: bool = True) -> dict:
        """KV block usage, the cache's element type ("kv_cache_dtype": "bfloat16",
        "fp8_e4m3", ...) and bytes per token, prefix cache, fragmentation, scheduling and
        throughput counters; detailed=False skips the fragmentation and ref-count histogram
        (see KVCacheManager.usage), for a snapshot taken while serving."""
        live = [r for r in self.scheduler.running]
        s = self.kv_manager.usage(live, detailed)
        c = dict(self.counters)
        busy = c["busy_time_s"] or float("nan")
        c["prompt_tokens_per_s"] = c["num_prompt_tokens"] / busy
        c["generation_tokens_per_s"] = c["num_generated_tokens"] / busy
        s.update(c)
        if detailed:
            s.update(self._beam_block_stats())
        sch = self.scheduler
        s.update({
            "kv_cache_dtype": self.kv_spec.dtype_name,
            "kv_cache_bytes_per_token": self.kv_spec.bytes_per_token,
            "num_running": len(sch.running), "num_waiting": len(sch.waiting),
            "num_swapped": len(sch.swapped), "peak_batch_size": sch.peak_num_running,
            "peak_used_blocks": sch.peak_num_used_blocks,
            "num_preemptions": sum(sch.num_preemptions.values()),
            "num_preemptions_recompute": sch.num_preemptions["recompute"],
            "num_preemptions_swap": sch.num_preemptions["swap"],
            "num_chunked_prefill_steps": sch.num_chunked_prefill_steps,
            "num_multi_step_plans": sch.num_multi_step_plans,
            "num_multi_step_passes": sch.num_multi_step_passes,
        })
        if sch.proposer is not None:
            s.update(spec_decode_stats(sch))
        return s

    def _beam_block_stats(self) -> dict:
        """Blocks of the running beam searches (docs/design.md, "Beam search"): held (distinct
        blocks), block-table entries (what the slots would hold without sharing), and shared
        (held by two or more slots of one search)."""
        kv = self.kv_manager
        groups = {id(r.beam): r.group for r in self.scheduler.running
                  if r.beam is not None and len(r.group) > 1}
        held = refs = shared = 0
        for group in groups.values():
            counts = Counter(b.block_id for seq in group
                             for b in kv.req_to_blocks.get(seq.request_id, ()))
            held += len(counts)
            refs += sum(counts.values())
            shared += sum(1 for c in counts.values() if c > 1)
        return {"num_beam_searches": len(groups), "num_beam_blocks": held,
                "num_beam_block_refs": refs, "num_beam_shared_blocks": shared}

    def reset_stats(self) -> None:
        """Zero the counters, peaks and prefix-cache hit counts that `stats()` reports (the
        server calls it after its warm-up); blocks and cached prefixes stay as they are."""
        for key in self.counters:
            self.counters[key] = type(self.counters[key])()
        sch = self.scheduler
        sch.num_preemptions.clear()
        sch.num_chunked_prefill_steps = sch.peak_num_running = sch.peak_num_used_blocks = 0
        sch.num_multi_step_plans = sch.num_multi_step_passes = 0
        sch.num_spec_steps = sch.num_spec_drafts = sch.num_spec_early_reads = 0
        sch.num_spec_draft_tokens = sch.num_spec_accepted_tokens = 0
        if sch.acceptance is not None:
            sch.acceptance.num_pauses = 0
        self.kv_manager.stats = type(self.kv_manager.stats)()

    def check_integrity(self) -> None:
        """Assert, between steps, the block manager's invariants (docs/design.md) and that the
        device side's rows agree with the host, on every tensor-parallel rank: one row per
        running sequence (and per sequence finished or preempted since the last plan, which
        the next plan drops), holding its tokens (-1 where one is still being sampled),
        computed count and block table."""
        self.kv_manager.check_integrity()
        if self.executor.remotes:
            snapshots = self.executor.row_snapshots()
        else:
            batch = self.model_runner.batch
            snapshots = [{req_id: batch.row_view(req_id) for req_id in batch.row_of}]
        running = {seq.request_id: seq for seq in self.scheduler.running}
        changed = self.kv_manager.has_block_changes
        for rank, snapshot in enumerate(snapshots):
            rows = set(snapshot)
            assert set(running) <= rows <= set(running) | self.scheduler.ids_to_drop(), (
                f"rank {rank}: rows {sorted(rows)}, running {sorted(running)}, to drop "
                f"{sorted(self.scheduler.ids_to_drop())}")
            for req_id, seq in running.items():
                token_ids, num_computed, block_ids = snapshot[req_id]
                assert token_ids == seq.all_token_ids, (
                    f"rank {rank}, {seq}: the row holds {token_ids}, the request "
                    f"{seq.all_token_ids}")
                assert num_computed == seq.num_computed_tokens, (
                    f"rank {rank}, {seq}: the row has {num_computed} computed tokens")
                # entries given back by a sliding window hold stale ids there: never read
                released = self.kv_manager.num_released_blocks(req_id)
                assert changed or block_ids[released:] == self.kv_manager.block_ids(req_id)[
                    released:], (
                    f"rank {rank}, {seq}: the row's block table {block_ids}, the KV manager's "
                    f"{self.kv_manager.block_ids(req_id)} ({released} released)")

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (nothing to do for a model in this
        process); the engine cannot step afterwards. Garbage collection does the same."""
        self.executor.shutdown()
