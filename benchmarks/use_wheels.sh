# Sourced by the device scripts: install the carried wheels in .whl/ (benchmarks/README.md,
# "Running on the lent H200") into /tmp/site and put it, then this tree, on PYTHONPATH.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /dev/null 2>&1 || echo "wheel install failed"
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
