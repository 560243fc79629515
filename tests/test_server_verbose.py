"""`pagedrt -v serve` through a real server process on 127.0.0.1 (SmolLM2, CPU, a small KV
pool): /metrics has the pool's figures from the first scrape after the server says it is
ready, and the engine core logs at INFO with -v (its preemptions, as `pagedrt -v generate`
does). Every wait is bounded. (Here the core's first idle snapshot usually arrives before the
first scrape anyway; the snapshot in CoreInfo, which removes that race, is checked in
tests/test_engine_core.py.)"""

from __future__ import annotations

import concurrent.futures
import re

import httpx
import pytest
from server_process import start_server, stop_server
from test_server import API_KEY, AUTH, MODEL, wait_until_idle

NUM_KV_BLOCKS = 12  # 192 tokens: three requests of about 85 tokens cannot all run at once


@pytest.fixture(scope="module")
def verbose_server(smollm2_path, tmp_path_factory):
    """(base URL, log path) of a `pagedrt -v serve` with a 12-block pool; its first scrape of
    /metrics is taken at once (before any request), as `first_metrics`."""
    log_path = tmp_path_factory.mktemp("verbose") / "server.log"
    proc, url = start_server(
        ["--api-key", API_KEY, "--served-model-name", MODEL,
         "--num-kv-blocks", str(NUM_KV_BLOCKS), "--max-model-len", "192"], log_path,
        global_args=("-v",))
    try:
        first = httpx.get(f"{url}/metrics", headers=AUTH, timeout=10).text
        yield url, log_path, first
    finally:
        stop_server(proc)


def test_metrics_have_the_pool_from_the_first_scrape(verbose_server):
    _, _, first = verbose_server
    values = dict(re.findall(r"^(pagedrt_\w+) (\S+)$", first, re.MULTILINE))
    assert float(values["pagedrt_kv_blocks_total"]) == NUM_KV_BLOCKS
    assert float(values["pagedrt_kv_blocks_used"]) == 0
    assert (float(values["pagedrt_kv_blocks_free"]) + float(values["pagedrt_kv_blocks_cached"])
            == NUM_KV_BLOCKS)
    assert float(values["pagedrt_kv_cache_bytes_per_token"]) > 0
    assert re.search(r"^pagedrt_kv_cache_info\{.*\} 1\.0$", first, re.MULTILINE), first


def test_the_core_logs_its_preemptions_with_v(verbose_server):
    url, log_path, _ = verbose_server
    body = {"model": MODEL, "max_tokens": 80, "temperature": 0, "ignore_eos": True}
    prompts = ["One, two, three,", "Once upon a time", "The capital of France"]
    with httpx.Client(base_url=url, headers=AUTH, timeout=120) as http, \
            concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda p: http.post("/v1/completions",
                                                    json={**body, "prompt": p}), prompts))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert all(r.json()["usage"]["completion_tokens"] == 80 for r in replies)
    m = wait_until_idle(url)
    assert m["pagedrt_num_preemptions_total"] >= 1  # (else this would test nothing)
    assert "preempted request" in log_path.read_text(errors="replace")
    assert m["pagedrt_kv_blocks_free"] + m["pagedrt_kv_blocks_cached"] == NUM_KV_BLOCKS
