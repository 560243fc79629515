"""Script form of `pagedrt bench attention` (see pagedrt/bench/attention.py):

    PYTHONPATH=$PWD python3 benchmarks/bench_attention.py --out DIR [--sweep]
"""

import sys

from pagedrt.bench.attention import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
