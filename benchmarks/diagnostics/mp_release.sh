#!/usr/bin/env bash
# When does a worker-process engine's GPU memory come back? Runs one short batch-1 latency
# bench with `--distributed-executor-backend mp`, then samples the device's used memory and
# its compute processes every 0.2 s for 15 s (issue 15: an in-process engine started right
# after such a run once found the memory still held).  OUT=out bash THIS_FILE
set -u
out="${OUT:-out}"; mkdir -p "$out"
t0=$(date +%s.%N)
timeout 120 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b --contexts 512 \
    --num-tokens 32 --distributed-executor-backend mp --name mp_release --out "$out" \
    > "$out/mp_release.log" 2>&1
echo "bench exited with $? after $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{print b-a}") s"
for i in $(seq 75); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)
    apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')
    printf "%5.1f s  used %6s MiB  apps: %s\n" "$(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{print b-a}")" "$used" "$apps"
    sleep 0.2
done | awk '!seen[$3 $5 $6 $7 $8]++'   # only the lines where something changed
