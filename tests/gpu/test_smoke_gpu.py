"""The engine on CUDA (Triton kernels, CUDA graphs) against the same engine on CPU (torch
reference path), fp32: greedy tokens of the tiny random-weight Llama must be identical."""

from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams


def _on(device: str):
    loaded = build_tiny_llama(seed=0)
    return loaded._replace(model=loaded.model.to(device))


def test_tiny_model_cuda_matches_cpu():
    prompts = [[1, 5, 9, 20, 7], list(range(3, 40)), list(range(100, 164))]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    for device in ("cpu", "cuda"):
        llm = LLM(_on(device), num_kv_blocks=64, block_size=16, max_num_seqs=4)
        outs[device] = [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                     use_tqdm=False)]
    assert outs["cuda"] == outs["cpu"]
