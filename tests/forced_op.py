"""A CUDA engine's greedy tokens with one timed op forced to a config, shared by the GPU tests
of the 1-4-row one-kernel ops (tests/gpu/test_mlp_gpu.py, tests/gpu/test_attn_o_gpu.py)."""

from __future__ import annotations

from pagedrt import LLM, SamplingParams
from pagedrt.ops import gemv_triton

PROMPTS = [[1, 5, 9, 20, 7], list(range(3, 40)), list(range(100, 164)), [7]]


def greedy_tokens_forcing(monkeypatch, loaded, op: str, config, patches=()):
    """(the greedy tokens, 24 each, of the first 1 and then 4 PROMPTS in a CUDA engine of
    `loaded` (CUDA graphs on), the keys forced): wherever a layer asks the start-up timing
    (`gemv_triton.fused_or_unfused`) for the op named `op`, it runs `config` untimed; the
    other ops are timed as usual. `patches`: (object, attribute, value) set meanwhile."""
    timed = gemv_triton.fused_or_unfused
    forced = []

    def forcing(key, unfused, fused, *args, **kwargs):
        if key[0] == op:
            forced.append(key)
            return fused(config)
        return timed(key, unfused, fused, *args, **kwargs)

    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    with monkeypatch.context() as mp:
        mp.setattr(gemv_triton, "fused_or_unfused", forcing)
        for obj, name, value in patches:
            mp.setattr(obj, name, value)
        llm = LLM(loaded, num_kv_blocks=64, block_size=16, max_num_seqs=4)
        tokens = [[o.outputs[0].token_ids
                   for o in llm.generate(PROMPTS[:n], params, use_tqdm=False)]
                  for n in (1, 4)]
    return tokens, forced
