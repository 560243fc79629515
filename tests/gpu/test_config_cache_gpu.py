"""Timed config choices on disk (PAGEDRT_CONFIG_CACHE, pagedrt/ops/config_cache.py) on CUDA: a
second engine started with the same settings times nothing, chooses what the first chose and
gives its tokens (bf16, so the projections take the timed paths)."""

import torch
import triton.testing
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.ops import config_cache, config_timing, gemv_triton, matmul_triton


def test_a_second_engine_takes_the_first_ones_choices_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", str(tmp_path))
    benched = []
    bench = triton.testing.do_bench_cudagraph

    def counted(fn, *args, **kwargs):
        benched.append(fn)
        return bench(fn, *args, **kwargs)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", counted)
    loaded = build_tiny_llama(seed=0)
    loaded = loaded._replace(model=loaded.model.to("cuda", torch.bfloat16))
    prompts = [[1, 5, 9, 20, 7], list(range(3, 40)), list(range(100, 164)), [7]] * 3
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outs, chosen = [], []
    for _ in range(2):
        # fresh tables and cache objects: as in a new process
        tables = [{}, {}, {}]
        monkeypatch.setattr(gemv_triton, "_CHOICE", tables[0])
        monkeypatch.setattr(gemv_triton, "_FUSED_CHOICE", tables[1])
        monkeypatch.setattr(matmul_triton, "_CHOICE", tables[2])
        monkeypatch.setattr(config_timing, "TIMED", {})
        monkeypatch.setattr(config_cache, "_CACHES", {})
        benched.clear()
        monkeypatch.setattr(config_timing, "TOTALS", config_timing.TimingTotals())
        llm = LLM(loaded, num_kv_blocks=128, block_size=16, max_num_seqs=16)
        assert llm.llm_engine.model_runner.graph_capture_s > 0
        totals = config_timing.TOTALS
        if not outs:  # the first engine timed every choice; the second read them all
            assert totals.choices_timed > 0 and totals.choices_read == 0
        else:
            assert totals.choices_timed == 0 and totals.choices_read > 0
        outs.append([[o.outputs[0].token_ids for o in llm.generate(prompts[:n], params,
                                                                   use_tqdm=False)]
                     for n in (1, 4, 12)])
        chosen.append([dict(t) for t in tables])
        del llm
        if not outs[1:]:
            assert benched, "the first engine timed nothing"
            assert any(t for t in tables), "the first engine chose nothing"
    assert benched == [], "the second engine timed configs its file holds"
    # the second engine's choices are the first's (it may look up fewer: a fused op read
    # from the file no longer runs its plain chain, whose matmul the first engine timed
    # inside the fused op's baseline)
    assert all(second.items() <= first.items() for first, second in zip(*chosen, strict=True))
    assert any(chosen[1]), "the second engine looked nothing up"
    assert outs[1] == outs[0]
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].read_text().count("\n") == sum(map(len, chosen[0]))
