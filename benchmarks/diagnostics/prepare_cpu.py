"""CPU time of `ModelRunner.prepare` alone in steady async decode with the stub model of
benchmarks/host_step_cpu.py: the median over 300 steps at 1, 8 and 256 rows, in microseconds
(thread CPU time). A diagnostic for changes to the step's input preparation, not a benchmark
of record. --staged: decode steps staged for a graph runner (pagedrt/ops/graph_inputs.py)
whose "replays" run eagerly, as the CUDA path prepares them.

    PYTHONPATH=$PWD python benchmarks/diagnostics/prepare_cpu.py [--staged]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import host_step_cpu

from pagedrt.config import EngineConfig
from pagedrt.engine.llm_engine import LLMEngine
from pagedrt.models.loader import LoadedModel
from pagedrt.sampling_params import SamplingParams


def prepare_us(num_seqs: int, steps: int = 300, staged: bool = False) -> float:
    config = host_step_cpu.stub_config(64)
    cfg = EngineConfig(num_kv_blocks=num_seqs * 40 + 8, max_num_seqs=num_seqs,
                       max_num_batched_tokens=8192, async_scheduling=True)
    engine = LLMEngine(config=cfg, device="cpu",
                       loaded=LoadedModel(host_step_cpu.StubModel(config), config, None, "stub"))
    runner = engine.model_runner
    if staged:
        host_step_cpu.stage_for_graphs(engine)
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    for i in range(num_seqs):
        engine.add_request(str(i), [t % 60 + 1 for t in range(200)], params, stream=False)
    for _ in range(20):  # past the prefills
        engine.step()
    prepare, times = runner.prepare, []

    def timed(*args):
        start = time.thread_time_ns()
        inputs = prepare(*args)
        times.append(time.thread_time_ns() - start)
        return inputs

    runner.prepare = timed
    for _ in range(steps):
        engine.step()
    assert not staged or runner.graph_runner.staged_inputs
    return statistics.median(times) / 1e3


if __name__ == "__main__":
    staged = "--staged" in sys.argv
    for n in (1, 8, 256):
        print(f"{n} rows: prepare {prepare_us(n, staged=staged):.1f} us (median CPU time)")
