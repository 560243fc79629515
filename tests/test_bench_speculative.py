"""`pagedrt bench throughput --compare-speculative` on CPU: engines made in ABBA order for
--repeats rounds, every engine freed before the next is made (an engine kept alive holds its KV
cache on the device, and the next one then cannot size its own), ratios per round and of the
medians."""

from __future__ import annotations

import gc
import json
import weakref

from pagedrt.bench import throughput


def test_compare_speculative_alternates_and_frees_each_engine(smollm2_path, tmp_path,
                                                              monkeypatch):
    made: list[tuple[weakref.ref, bool]] = []  # (engine, speculating)
    make_llm = throughput.make_llm

    def tracked(model, args, **overrides):
        gc.collect()
        alive = [on for ref, on in made if ref() is not None]
        assert not alive, f"engines still alive when the next is made: {alive}"
        llm = make_llm(model, args, **overrides)
        made.append((weakref.ref(llm.llm_engine),
                     llm.llm_engine.config.speculative_config is not None))
        return llm

    free_llm = throughput.free_llm
    freed = []

    def checked_free(llm):
        engine = weakref.ref(llm.llm_engine)
        free_llm(llm)  # (no gc.collect here: the next engine is sized right after this)
        assert engine() is None, "free_llm left the engine alive: its KV cache stays put"
        freed.append(True)

    monkeypatch.setattr(throughput, "make_llm", tracked)
    monkeypatch.setattr(throughput, "free_llm", checked_free)
    spec = ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, '
            '"prompt_lookup_max": 2}')
    assert throughput.main([
        "--model", smollm2_path, "--device", "cpu", "--dtype", "float32", "--num-requests", "2",
        "--input-len", "8", "--output-len", "3", "--num-kv-blocks", "64", "--out",
        str(tmp_path), "--name", "s", "--compare-speculative", "--speculative-config", spec,
        "--repeats", "2", "--batch-sizes", "1", "--skip-step-split",
        "--warm-up-requests", "1"]) == 0
    assert [on for _, on in made] == [False, True, True, False]  # ABBA
    assert len(freed) == 4
    rows = json.loads((tmp_path / "s.json").read_text())["results"]
    for workload in {r["workload"] for r in rows}:
        mine = [r for r in rows if r["workload"] == workload]
        assert sorted((r["repeat"], r["speculation"]) for r in mine) == [
            (0, "off"), (0, "on"), (1, "off"), (1, "on")]
        for r in mine:
            if r["speculation"] == "on":
                off = next(o for o in mine
                           if o["speculation"] == "off" and o["repeat"] == r["repeat"])
                assert r["throughput_vs_off"] == r["output_tok_s"] / off["output_tok_s"]
                assert r["throughput_vs_off_median"] > 0
