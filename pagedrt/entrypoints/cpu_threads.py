"""CPU threads: torch's intra-op threads from $PAGEDRT_NUM_THREADS, and the hints that name
them when a CPU run is slow. On a CPU that other busy processes share, fewer threads than
cores can be several times faster (README, "Quick start")."""

from __future__ import annotations

import os


def cpu_threads_note(device: str, threads: int, world_size: int = 1) -> str:
    """", N CPU threads (PAGEDRT_NUM_THREADS sets them)" after a CPU device in a status line
    (empty for other devices; with several ranks, ", N CPU threads per rank x W ranks"; the
    parenthesis only where the variable is not set): on a CPU that other processes share,
    fewer threads can be several times faster (README)."""
    if not device.startswith("cpu"):
        return ""
    hint = "" if os.environ.get("PAGEDRT_NUM_THREADS") else " (PAGEDRT_NUM_THREADS sets them)"
    ranks = f" per rank x {world_size} ranks" if world_size > 1 else ""
    return f", {threads} CPU thread{'s' if threads != 1 else ''}{ranks}{hint}"


SLOW_CPU_TOK_S = 8.0  # below this `generate` suggests one thread (the default model does 22-40)
# fewer generated tokens than this say little about the decode rate (a reply that ends at once
# is timed by its prompt's prefill alone), so no hint
SLOW_CPU_MIN_TOKENS = 16


def slow_cpu_hint(device: str, threads: int, generated_tokens: int, seconds: float,
                  python_api: bool = False) -> str:
    """A line for `pagedrt generate` (or, with `python_api`, for `LLM.generate`'s warning)
    when a CPU run with several threads generated at least SLOW_CPU_MIN_TOKENS tokens at
    under SLOW_CPU_TOK_S tokens/s over `seconds` (on a CPU that other processes share, one
    thread was 11-23x faster: README, "Quick start"); else "", and "" under
    TRITON_INTERPRET=1 (the Triton interpreter is slow whatever the threads). For the command
    also "" where PAGEDRT_NUM_THREADS is set (the user chose); in Python that variable does
    nothing (only the `pagedrt` command reads it), and the hint says so."""
    generated_tok_s = generated_tokens / seconds if seconds > 0 else float("inf")
    chosen = os.environ.get("PAGEDRT_NUM_THREADS")
    if (not device.startswith("cpu") or threads < 2 or (chosen and not python_api)
            or generated_tokens < SLOW_CPU_MIN_TOKENS or generated_tok_s >= SLOW_CPU_TOK_S
            or os.environ.get("TRITON_INTERPRET") == "1"):  # interpreted kernels: expected
        return ""
    fix = ("torch.set_num_threads(1) before generating" if python_api
           else "PAGEDRT_NUM_THREADS=1")
    if python_api and chosen:
        fix += " (PAGEDRT_NUM_THREADS is read by the `pagedrt` command only, not in Python)"
    return (f"[hint] {generated_tok_s:.1f} generated tok/s with {threads} CPU threads: if other "
            f"processes share this CPU, {fix} is often several times faster")


def busy_cpu_hint(device: str, threads: int, load: float | None, cores: int | None) -> str:
    """A line for `pagedrt generate` to print before it generates, and for `pagedrt serve`
    once it serves (`launcher.ready_lines`), where the CPU was already busy when the command
    started: a 1-minute load average `load` (`load_average()`, taken before the model loads,
    so that the load is other processes') of at least one runnable process per core
    (`cores`), with several threads and PAGEDRT_NUM_THREADS unset. Then
    `slow_cpu_hint`'s advice comes before the wait instead of after it (a fresh user's run of
    2026-12-06 waited 165 s at 1.1 tok/s on a shared 2-core CPU; with one thread, 31.7). ""
    otherwise, and "" under TRITON_INTERPRET=1 or where the load average is unknown (None)."""
    if (not device.startswith("cpu") or threads < 2 or load is None or not cores
            or os.environ.get("PAGEDRT_NUM_THREADS") or load < cores
            or os.environ.get("TRITON_INTERPRET") == "1"):
        return ""
    return (f"[hint] this CPU is busy (load average {load:.1f} on {cores} cores): with "
            f"{threads} threads generation may crawl; PAGEDRT_NUM_THREADS=1 is often several "
            f"times faster")


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def threads_per_rank(world_size: int, cores: int | None = None) -> int:
    """torch threads for each of `world_size` CPU worker processes of one engine when
    PAGEDRT_NUM_THREADS is unset: the cores shared out (at least 1). Each process taking one
    thread per core made `-tp 3` on 2 cores run 6 threads and generate 18x slower than one
    rank (a fresh user's run of 2026-12-07: 0.8 tok/s, against 14). `cores`: os.cpu_count()
    by default."""
    cores = os.cpu_count() if cores is None else cores
    return max(1, (cores or 1) // max(1, world_size))


def set_worker_threads(device_type: str, world_size: int) -> None:
    """A worker process's torch threads: $PAGEDRT_NUM_THREADS where set, else on a CPU with
    several ranks `threads_per_rank(world_size)`; otherwise torch's default."""
    if os.environ.get("PAGEDRT_NUM_THREADS"):
        set_num_threads_from_env()
    elif device_type == "cpu" and world_size > 1:
        import torch

        torch.set_num_threads(threads_per_rank(world_size))


def set_num_threads_from_env() -> None:
    """$PAGEDRT_NUM_THREADS sets torch's intra-op CPU threads for every `pagedrt` command
    (default: torch's choice, one per core). Raises ValueError if it is not a positive int."""
    value = os.environ.get("PAGEDRT_NUM_THREADS")
    if not value:
        return
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"PAGEDRT_NUM_THREADS={value!r} must be a positive integer")
    import torch

    torch.set_num_threads(int(value))
