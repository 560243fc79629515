"""The in-step timing of the decode ops' tile choices (pagedrt/engine/step_timing.py), its
candidates (config_timing.step_candidates), the start-up timing's record of every config's time
(config_timing.fastest_config's `record`) and PAGEDRT_STEP_TIMING's batch sizes, with stand-ins
for the GPU: configs are labels, a "graph" is the table's state when it was captured, and its
time comes from a dict."""

from __future__ import annotations

import pytest
import torch

from pagedrt.engine import step_timing
from pagedrt.ops import config_timing


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch):
    monkeypatch.setattr(step_timing, "_DONE", set())
    monkeypatch.setattr(step_timing, "REPORT", [])


class _Step:
    """capture() snapshots the table; time_graph() returns the step ms of the snapshot's
    configs (summed over ops, with a per-call drift) and logs the calls."""

    def __init__(self, table: dict, ms: dict, drift: float = 0.0) -> None:
        self.table, self.ms, self.drift = table, ms, drift
        self.captured, self.timed = [], []

    def capture(self):
        snap = dict(self.table)
        self.captured.append(snap)
        return snap

    def time_graph(self, snap) -> float:
        self.timed.append(snap)
        return sum(self.ms[k][cfg] for k, cfg in snap.items()) + self.drift * len(self.timed)


def test_keeps_the_config_of_the_fastest_step_and_alternates_rounds():
    table = {"gate_up": "a", "down": "x"}
    ms = {"gate_up": {"a": 0.30, "b": 0.28, "c": 0.31}, "down": {"x": 0.20, "y": 0.25}}
    step = _Step(table, ms, drift=1e-4)
    report = step_timing.refine([(table, "gate_up", ["a", "b", "c"]),
                                 (table, "down", ["x", "y"])], step.capture, step.time_graph)
    assert table == {"gate_up": "b", "down": "x"}
    assert [(c.key, c.chosen_alone, c.chosen) for c in report] == [
        ("gate_up", "a", "b"), ("down", "x", "x")]
    # one capture per config; the later op is timed with the earlier op's new choice
    assert [s["gate_up"] for s in step.captured] == ["a", "b", "c", "b", "b"]
    # rounds alternate the order: a b c, c b a, a b c
    assert [s["gate_up"] for s in step.timed[:9]] == list("abccbaabc")
    assert step_timing.REPORT == report
    assert step_timing.report_dict()["gate_up"]["kept"] == ["b"]


def test_a_gain_under_min_gain_keeps_the_config_chosen_alone():
    table = {"k": (8, 256, 4)}
    incumbent_ms = 0.600
    ms = {"k": {(8, 256, 4): incumbent_ms,
                (16, 256, 4): incumbent_ms * (1 - step_timing.MIN_GAIN / 2),
                None: incumbent_ms * 1.2}}
    step = _Step(table, ms)
    report = step_timing.refine([(table, "k", [(8, 256, 4), (16, 256, 4), None])],
                                step.capture, step.time_graph)
    assert table["k"] == (8, 256, 4) and report[0].chosen == (8, 256, 4)
    ms["k"][(16, 256, 4)] = incumbent_ms * (1 - 2 * step_timing.MIN_GAIN)
    table2 = {"k2": (8, 256, 4)}
    step2 = _Step(table2, {"k2": ms["k"]})
    step_timing.refine([(table2, "k2", [(8, 256, 4), (16, 256, 4), None])],
                       step2.capture, step2.time_graph)
    assert table2["k2"] == (16, 256, 4)
    ms["k"][None] = incumbent_ms * 0.5  # the plain path (None) can win too
    table3 = {"k3": (8, 256, 4)}
    step3 = _Step(table3, {"k3": ms["k"]})
    step_timing.refine([(table3, "k3", [(8, 256, 4), (16, 256, 4), None])],
                       step3.capture, step3.time_graph)
    assert table3["k3"] is None


def test_an_op_is_timed_once_per_process_and_a_failure_restores_its_choice():
    table = {"k": "a"}
    step = _Step(table, {"k": {"a": 2.0, "b": 1.0}})
    step_timing.refine([(table, "k", ["a", "b"])], step.capture, step.time_graph)
    assert table["k"] == "b"
    table["k"] = "a"  # a second engine in the process: the op is not timed again
    assert step_timing.refine([(table, "k", ["a", "b"])], step.capture, step.time_graph) == []
    assert table["k"] == "a"

    other = {"j": "a"}

    def failing_capture():
        if other["j"] == "b":
            raise RuntimeError("capture failed")
        return dict(other)

    with pytest.raises(RuntimeError, match="capture failed"):
        step_timing.refine([(other, "j", ["a", "b"])], failing_capture, lambda g: 1.0)
    assert other["j"] == "a"


def _key(n: int, k: int, rows: int, fused: bool) -> tuple:
    shape = torch.Size([n, k])
    return (("rmsnorm", tuple(shape), rows, torch.bfloat16, False, True, 0) if fused
            else (shape, rows, torch.bfloat16, False, 0))


def test_step_candidates_close_configs_largest_weight_first(monkeypatch):
    plain, fused = {}, {}
    monkeypatch.setattr(config_timing, "TIMED", {})
    o, gate_up, down, qkv2 = (_key(896, 896, 1, False), _key(9728, 896, 1, True),
                              _key(896, 4864, 1, False), _key(1152, 896, 2, True))
    plain[o], fused[gate_up], plain[down], fused[qkv2] = (4, 512, 4), (32, 128, 4), None, None
    for table, key, rows, times in [
        (plain, o, 1, {None: 5.0, (4, 512, 4): 3.0, (8, 256, 4): 3.2, (2, 2048, 4): 3.4}),
        (fused, gate_up, 1, {None: 6.0, (32, 128, 4): 4.70, (16, 256, 4): 4.75,
                             (8, 256, 4): 4.90, (8, 512, 4): 5.0, (4, 1024, 4): 5.1}),
        (plain, down, 1, {None: 8.0, (4, 512, 4): 9.5}),  # one config within 10%: left out
        (fused, qkv2, 2, {None: 4.0, (8, 256, 4): 4.1}),  # another row count
    ]:
        config_timing.TIMED[id(table), key] = (table, rows, times)
    got = config_timing.step_candidates(1, margin=0.10, limit=4)
    assert [(key, configs) for _, key, configs in got] == [
        (gate_up, [(32, 128, 4), (16, 256, 4), (8, 256, 4), (8, 512, 4)]),  # 4 of 5 in 10%
        (o, [(4, 512, 4), (8, 256, 4)]),  # 3.4 is over 3.0 * 1.1
    ]
    assert got[0][0] is fused and got[1][0] is plain
    assert [key for _, key, _ in config_timing.step_candidates(2)] == [qkv2]
    # the table's own choice is always timed, even when not among the fastest alone
    plain[o] = None
    assert config_timing.step_candidates(1)[1][2] == [None, (4, 512, 4), (8, 256, 4)]


@pytest.mark.parametrize(("value", "buckets"), [
    (None, set()), ("", set()), ("0", set()), ("1", {1}), ("1, 8,32", {1, 8, 32})])
def test_step_timing_batch_sizes(value, buckets):
    assert step_timing.parse_buckets(value) == buckets


@pytest.mark.parametrize("value", ["yes", "1,,8", "-1", "8.5"])
def test_step_timing_refuses_what_is_not_batch_sizes(value):
    with pytest.raises(ValueError, match=f"PAGEDRT_STEP_TIMING={value!r}: give the decode"):
        step_timing.parse_buckets(value)


def test_fastest_config_records_every_time(monkeypatch):
    import triton.testing

    monkeypatch.setattr(config_timing, "COLD_L2_TIMING", False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", lambda fn, rep: fn())
    monkeypatch.setattr(config_timing, "TIMED", {})
    alone = {"a": 0.98, "b": 0.90, "c": 0.88}
    table = {}
    best = config_timing.fastest_config(lambda: 1.0, alone.get, ["a", "b", "c"], rep=1,
                                       record=(table, "key", 8))
    assert best == "b"  # c is not 5% faster than b
    assert config_timing.TIMED == {(id(table), "key"): (table, 8, {None: 1.0, **alone})}


def test_matmul_keys_give_their_row_count():
    from pagedrt.ops.matmul_triton import _key_rows

    shape = torch.Size([1152, 896])
    assert _key_rows((shape, 32, torch.bfloat16, False, 0)) == 32  # linear
    assert _key_rows(("silu_mul", shape, 8, torch.bfloat16, 0)) == 8
    assert _key_rows(("qkv_rope", shape, 64, torch.bfloat16, True, 0)) == 64
    assert _key_rows(("k",)) == 0


def test_an_op_the_step_does_not_run_is_not_timed():
    """The plain gate/up inside the fused op's unfused chain runs only while the fused op
    keeps None: once the fused op keeps a fused config, its graphs would all be alike."""
    fused, plain = {"rmsnorm": None}, {"gate_up": "p1"}

    def used():  # what a forward looks up as the tables stand
        keys = {(id(fused), "rmsnorm")}
        if fused["rmsnorm"] is None:
            keys.add((id(plain), "gate_up"))
        return keys

    ms = {"rmsnorm": {None: 1.0, "f1": 0.5}, "gate_up": {"p1": 0.2, "p2": 0.1}}
    step = _Step({}, {})

    def capture():
        snap = {"rmsnorm": fused["rmsnorm"], "gate_up": plain["gate_up"]}
        step.captured.append(snap)
        return snap

    def time_graph(snap):
        return ms["rmsnorm"][snap["rmsnorm"]] + (
            ms["gate_up"][snap["gate_up"]] if snap["rmsnorm"] is None else 0.0)

    report = step_timing.refine([(fused, "rmsnorm", [None, "f1"]),
                                 (plain, "gate_up", ["p1", "p2"])], capture, time_graph,
                                used=used)
    assert fused["rmsnorm"] == "f1" and [c.key for c in report] == ["rmsnorm"]
    assert plain["gate_up"] == "p1" and len(step.captured) == 2  # gate_up never captured


def test_recording_use_files_the_lookups_while_held():
    table = {}
    config_timing.note_use(table, "before")  # not recording: nothing kept
    with config_timing.recording_use() as used:
        config_timing.note_use(table, "k")
    config_timing.note_use(table, "after")
    assert used == {(id(table), "k")}
