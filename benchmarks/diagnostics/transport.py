"""Which transport and encoding for the engine core's per-step messages (docs/design.md)?

Times, for a step message of N TokenEvents (the decode step of N streams), the encoding alone
(pickle vs msgspec msgpack) and a round trip between two processes (zmq PUSH/PULL over ipc vs a
multiprocessing Pipe), sender encoding and receiver decoding included, one message in flight.

    python benchmarks/diagnostics/transport.py [--rows 256] [--iters 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import tempfile
import time

import msgspec
import zmq

from pagedrt.entrypoints.engine_core import CoreOutputs
from pagedrt.outputs import TokenEvent


def make_message(rows: int) -> CoreOutputs:
    events = [TokenEvent(f"cmpl-{i:032x}-0", 0, 1000 + i, None, None, None) for i in range(rows)]
    return CoreOutputs(events, [], None)


ENCODERS = {
    "pickle": (lambda m: pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL), pickle.loads),
    "msgspec": (msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(CoreOutputs).decode),
}


def time_encoding(rows: int, iters: int) -> dict:
    message = make_message(rows)
    out = {}
    for name, (enc, dec) in ENCODERS.items():
        data = enc(message)
        t0 = time.perf_counter()
        for _ in range(iters):
            enc(message)
        t1 = time.perf_counter()
        for _ in range(iters):
            dec(data)
        t2 = time.perf_counter()
        out[name] = {"bytes": len(data), "encode_us": (t1 - t0) / iters * 1e6,
                     "decode_us": (t2 - t1) / iters * 1e6}
    return out


def _zmq_echo(address_in: str, address_out: str, codec: str, iters: int) -> None:
    enc, dec = ENCODERS[codec]
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(address_in)
    push.connect(address_out)
    for _ in range(iters):
        push.send(enc(dec(pull.recv())))
    pull.close(linger=0)
    push.close(linger=1000)
    ctx.term()


def _pipe_echo(conn, codec: str, iters: int) -> None:
    enc, dec = ENCODERS[codec]
    for _ in range(iters):
        conn.send_bytes(enc(dec(conn.recv_bytes())))


def time_round_trip(rows: int, iters: int) -> dict:
    ctx = mp.get_context("spawn")
    message = make_message(rows)
    out = {}
    for codec, (enc, dec) in ENCODERS.items():
        tmp = tempfile.mkdtemp()
        a_in, a_out = f"ipc://{tmp}/in", f"ipc://{tmp}/out"
        zctx = zmq.Context()
        push, pull = zctx.socket(zmq.PUSH), zctx.socket(zmq.PULL)
        pull.bind(a_out)
        p = ctx.Process(target=_zmq_echo, args=(a_in, a_out, codec, iters))
        p.start()
        push.connect(a_in)
        push.send(enc(message))
        dec(pull.recv())  # warm
        t0 = time.perf_counter()
        for _ in range(iters - 1):
            push.send(enc(message))
            dec(pull.recv())
        out[f"zmq+{codec}"] = (time.perf_counter() - t0) / (iters - 1) * 1e6
        p.join(10)
        push.close(linger=0)
        pull.close(linger=0)
        zctx.term()

        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=_pipe_echo, args=(theirs, codec, iters))
        p.start()
        ours.send_bytes(enc(message))
        dec(ours.recv_bytes())
        t0 = time.perf_counter()
        for _ in range(iters - 1):
            ours.send_bytes(enc(message))
            dec(ours.recv_bytes())
        out[f"pipe+{codec}"] = (time.perf_counter() - t0) / (iters - 1) * 1e6
        p.join(10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    enc = time_encoding(args.rows, args.iters)
    rt = time_round_trip(args.rows, args.iters)
    print(f"step message of {args.rows} TokenEvents")
    for name, r in enc.items():
        print(f"  {name:8s} {r['bytes']:7d} B  encode {r['encode_us']:7.1f} us  "
              f"decode {r['decode_us']:7.1f} us")
    print("round trip (encode, send, decode, echo back), one message in flight:")
    for name, us in rt.items():
        print(f"  {name:16s} {us:8.1f} us")


if __name__ == "__main__":
    main()
