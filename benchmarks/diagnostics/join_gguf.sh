# Sourced by the device-call scripts, in the call that carries the last part of the SmolLM2
# GGUF (.gguf_parts/p1, p2, p3, ~33 MB each: with the tracked tree a call carries under 64 MiB;
# the earlier calls made right before this one copied theirs to /tmp): join the parts into
# /tmp/smollm2.gguf, check its md5 against .gguf_parts/md5, and export SMOLLM2_GGUF
# (benchmarks/README.md, "Running on the lent H200").
cp .gguf_parts/p[0-9] /tmp/ 2>/dev/null
cat $(ls /tmp/p[0-9] | sort) > /tmp/smollm2.gguf
[ "$(md5sum /tmp/smollm2.gguf | cut -d' ' -f1)" = "$(cat .gguf_parts/md5)" ] || echo "GGUF md5 differs"
export SMOLLM2_GGUF=/tmp/smollm2.gguf
