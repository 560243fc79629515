"""`pagedrt serve --api-server-count 2`: two API processes on one port and one engine core give
the answers of `LLM.generate`, and the death of one API process stops the whole server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import openai
import pytest
from server_process import api_pids, engine_core_pid, start_server, stop_server

from pagedrt import LLM, SamplingParams

ENGINE_ARGS = ["--num-kv-blocks", "256", "--max-model-len", "2048"]


@pytest.fixture
def two_api_server(smollm2_path, tmp_path):
    log_path = tmp_path / "server.log"
    proc, url = start_server([*ENGINE_ARGS, "--api-server-count", "2"], log_path)
    try:
        yield proc, url, log_path
    finally:
        stop_server(proc)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().split(")")[-1].split()[0] != "Z"


def test_two_api_processes_serve_the_answers_of_llm_generate(two_api_server, smollm2):
    _, url, log_path = two_api_server
    assert len(api_pids(log_path)) == 2
    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(12)]
    llm = LLM(smollm2, num_kv_blocks=256, max_model_len=2048)
    expected = [o.outputs[0].text for o in llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)]

    async def one(client, prompt, stream):
        if stream:
            s = await client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=10,
                                                temperature=0, stream=True)
            return "".join([c.choices[0].text async for c in s])
        r = await client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=10,
                                            temperature=0)
        return r.choices[0].text

    async def run_all():
        # a fresh connection per request: the kernel spreads them over both processes
        texts = []
        for stream in (True, False):
            clients = [openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", timeout=120,
                                          max_retries=0) for _ in prompts]
            texts.append(await asyncio.wait_for(asyncio.gather(
                *(one(c, p, stream) for c, p in zip(clients, prompts))), timeout=240))
            for c in clients:
                await c.close()
        return texts

    streamed, whole = asyncio.run(run_all())
    assert streamed == expected and whole == expected


def test_a_dead_api_process_stops_the_server(two_api_server):
    proc, url, log_path = two_api_server
    core = engine_core_pid(log_path)
    first, second = api_pids(log_path)
    os.kill(first, signal.SIGKILL)
    assert proc.wait(timeout=20) == 1
    deadline = time.monotonic() + 10
    while _alive(core) or _alive(second):  # nothing left behind
        assert time.monotonic() < deadline, (core, second)
        time.sleep(0.1)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=2)


def test_sigterm_lets_every_api_process_drain(smollm2_path, tmp_path):
    """SIGTERM with a stream in flight on one of two API processes: the idle one leaves at
    once, and the core goes on serving the other's drain (before, the first pipe to close
    ended the core, and the stream was cut with "the engine core process died" after about
    0.5 s of a 4 s drain). The stream ends with its last token; the server exits with 0."""
    from test_server_faults import _Stream

    log_path = tmp_path / "server.log"
    proc, url = start_server([*ENGINE_ARGS, "--api-server-count", "2",
                              "--shutdown-timeout", "20"], log_path)
    try:
        stream = _Stream(url, max_tokens=48)
        stream.start()
        assert stream.started.wait(120), "no tokens within 120 s"
        proc.send_signal(signal.SIGTERM)
        stream.join(40)
        assert not stream.is_alive() and stream.error is None, stream.error
        assert stream.ended_with_done and not stream.error_events(), stream.payloads[-3:]
        chunks = [c for p in stream.payloads[:-1] if (c := json.loads(p))["choices"]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=40) == 0
        assert "engine core process died" not in log_path.read_text(errors="replace")
    finally:
        stop_server(proc)
