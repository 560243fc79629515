# Sourced by the device-call scripts, in the call after the one that kept .gguf_parts/p1 in
# /tmp: join it with .gguf_parts/p2 into /tmp/smollm2.gguf, check its md5 against
# .gguf_parts/md5, and export SMOLLM2_GGUF (benchmarks/README.md, "Running on the lent H200").
cat /tmp/p1 .gguf_parts/p2 > /tmp/smollm2.gguf
[ "$(md5sum /tmp/smollm2.gguf | cut -d' ' -f1)" = "$(cat .gguf_parts/md5)" ] || echo "GGUF md5 differs"
export SMOLLM2_GGUF=/tmp/smollm2.gguf
