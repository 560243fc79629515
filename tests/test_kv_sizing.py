"""KV-cache sizing on CUDA (`num_blocks_for_budget`) with the device's memory counters
simulated: memory that another process is still giving back is waited for, within a bound,
and an error names the memory other processes hold."""

import pytest
import torch
from tiny_model import TINY_CONFIG

from pagedrt.config import EngineConfig
from pagedrt.kv import kv_cache
from pagedrt.kv.kv_cache import KVCacheSpec, num_blocks_for_budget

GIB = 1 << 30


class FakeDevice:
    """torch.cuda's memory counters: `used_by_others` bytes held elsewhere, dropping to
    `after` once `polls` readings have been taken."""

    def __init__(self, used_by_others: int, polls: int, after: int, mine: int = GIB) -> None:
        self.total, self.mine = 80 * GIB, mine
        self.others, self.polls, self.after, self.readings = used_by_others, polls, after, 0

    def mem_get_info(self, device=None):
        self.readings += 1
        if self.readings > self.polls:
            self.others = self.after
        return self.total - self.mine - self.others, self.total


@pytest.fixture
def fake_cuda(monkeypatch):
    def install(dev: FakeDevice) -> FakeDevice:
        monkeypatch.setattr(torch.cuda, "mem_get_info", dev.mem_get_info)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: dev.mine)
        monkeypatch.setattr(kv_cache.time, "sleep", lambda s: None)
        return dev
    return install


def _spec():
    return KVCacheSpec.for_model(TINY_CONFIG, 16, torch.float32)


def test_waits_for_memory_another_process_is_giving_back(fake_cuda):
    dev = fake_cuda(FakeDevice(used_by_others=79 * GIB, polls=3, after=0))
    config = EngineConfig(gpu_memory_utilization=0.5)
    blocks = num_blocks_for_budget(_spec(), config, torch.device("cuda", 0))
    assert dev.readings == 4  # three readings with the memory held, then it came back
    assert blocks == (40 * GIB - GIB) // _spec().bytes_per_block


def test_names_the_memory_other_processes_hold(fake_cuda, monkeypatch):
    monkeypatch.setattr(kv_cache, "RELEASE_WAIT_S", 0.0)
    fake_cuda(FakeDevice(used_by_others=50 * GIB, polls=10**9, after=0))
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5 leaves .*other "
                                         r"processes hold about 53687091200 bytes"):
        num_blocks_for_budget(_spec(), EngineConfig(gpu_memory_utilization=0.5),
                              torch.device("cuda", 0))


def test_own_memory_is_not_waited_for(fake_cuda):
    dev = fake_cuda(FakeDevice(used_by_others=0, polls=0, after=0, mine=79 * GIB))
    with pytest.raises(ValueError, match="less than one block") as info:
        num_blocks_for_budget(_spec(), EngineConfig(gpu_memory_utilization=0.5),
                              torch.device("cuda", 0))
    assert dev.readings == 1 and "other processes" not in str(info.value)
