# Sourced by the scripts that alternate an older tree and this one in one device call
# (paired_h200.sh, schedhost_h200.sh): sets out (made), base, base_commit, head, head_commit,
# and extra (":$PYTHONPATH" or empty, to append to a tree's own path).
out="$(realpath -m "${OUT:-out}")"
mkdir -p "$out"
base="$(realpath "${BASE:?set BASE to a copy of the older pagedrt/ tree}")"
base_commit="${BASE_COMMIT:-base}"
# .commit first: the copied tree on the device has no .git, or one with a stale HEAD
head_commit="$(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo head)"
head="$PWD"
extra="${PYTHONPATH:+:$PYTHONPATH}"
