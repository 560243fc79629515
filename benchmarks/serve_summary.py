"""The table of benchmarks/serve_record.sh: served against offline output tok/s, ITL against the
engine's decode step, TTFT, from the JSON files of one run. A served row's name ends in
"cX.XX": the fraction of a core each client process was busy (near 1: the load generator, not
the server, set the pace).

    python3 benchmarks/serve_summary.py DIR
"""

from __future__ import annotations

import glob
import json
import os
import sys


def _offline(folder: str) -> dict[str, dict]:
    """workload ("512_128") -> the pagedrt result of `bench throughput --name offline_...`."""
    found = {}
    for path in glob.glob(os.path.join(folder, "offline_*.json")):
        key = os.path.basename(path)[len("offline_"):].split(".")[0]
        with open(path) as f:
            data = json.load(f)
        for r in data["results"]:
            if r.get("system") == "pagedrt":
                found[key] = r
                break
    return found


def _fmt(x, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    folder = sys.argv[1]
    offline = _offline(folder)
    for key, r in sorted(offline.items()):
        st = r.get("step_times", {})
        print(f"offline {key}: {r['output_tok_s']:,.0f} output tok/s, decode step median "
              f"{_fmt(st.get('decode_step_ms_median'), '.2f')} ms wall")
    print(f"{'run':32s} {'rate':>5s} {'ok':>4s} {'out tok/s':>10s} {'x offline':>9s} "
          f"{'TTFT p50':>9s} {'TTFT p99':>9s} {'ITL p50':>8s} {'ITL p99':>8s} "
          f"{'TPOT p50':>8s} {'ITL/step':>8s} {'goodput':>7s}")
    for path in sorted(glob.glob(os.path.join(folder, "serve_api*.json"))):
        name = os.path.basename(path).removesuffix(".json")
        with open(path) as f:
            data = json.load(f)
        workload = "512_128" if "512_128" in name else "128_512" if "128_512" in name else None
        if workload and "sustained" in name:  # 1,024 requests, 256 at a time: offline's 1,024
            workload = f"1024x_{workload}"
        base = offline.get(workload) if workload else None
        step = (base or {}).get("step_times", {}).get("decode_step_ms_median")
        for res in data.get("results", []):
            out = res.get("output_throughput")
            ratio = out / base["output_tok_s"] if base and out and res.get("num_requests",
                                                                          0) > 1 else None
            itl = res["itl_ms"]["median"]
            if res.get("client_cpu_s") is not None and res.get("duration_s"):
                busy = res["client_cpu_s"] / res["duration_s"] / res["num_client_processes"]
                name_col = f"{name} c{busy:.2f}"  # client processes' CPU busy fraction
            else:
                name_col = name
            print(f"{name_col:32s} {res.get('request_rate', '')!s:>5s} "
                  f"{res['completed']:>4d} {_fmt(out):>10s} {_fmt(ratio, '.2f'):>9s} "
                  f"{_fmt(res['ttft_ms']['median'], '.1f'):>9s} "
                  f"{_fmt(res['ttft_ms']['p99'], '.1f'):>9s} {_fmt(itl, '.2f'):>8s} "
                  f"{_fmt(res['itl_ms']['p99'], '.2f'):>8s} "
                  f"{_fmt(res['tpot_ms']['median'], '.2f'):>8s} "
                  f"{_fmt(itl / step if itl and step else None, '.2f'):>8s} "
                  f"{_fmt(res.get('goodput'), '.1f'):>7s}")


if __name__ == "__main__":
    main()
