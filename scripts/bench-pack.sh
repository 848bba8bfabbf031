#!/usr/bin/env bash
# Sequence packing (issue 58) on real text: a packed feed's waste, its
# balance across 8 ranks, and its tokens/s against Hugging Face's
# DataCollatorWithFlattening over a datasets Dataset and Grain's
# BestFitPackIterDataset, on the same documents and tokenizer.json, A B A B.
#
#   scripts/bench-pack.sh ROUNDS MAX_TOKENS FILE.txt [FILE.txt ...]
#   scripts/bench-pack.sh 3 2048 war-and-peace.txt tinyshakespeare.txt
#
# The texts are cut into paragraphs, the documents (scripts/bench/
# pack_corpus.py); any public-domain text works. Measured on Project
# Gutenberg's #2600 (War and Peace, 2600-0.txt of GITenberg/War-and-Peace_2600)
# and tinyshakespeare (karpathy/char-rnn, data/tinyshakespeare/input.txt).
# The tokenizer is the repository's all-MiniLM-L6-v2 tokenizer.json (a real
# WordPiece vocabulary of 30,522 tokens), its truncation and padding at 128
# turned off on every side: documents keep their own lengths.
#
# Each peer and sqlfeed run one unshuffled epoch from the Parquet files
# (read, tokenize, pack, batch) in a fresh process; tokens/s counts the
# corpus's tokens over the run's wall time. sqlfeed runs on one rank with
# 8 sequences per batch (shuffled too, for its cost), and on rank 0 of 8
# for the balance (`pack_imbalance`: the worst step's most costly rank ÷ the
# mean, by Σ len²) and the waste (padding ÷ all tokens).
#
# Needs a release build (cargo build --release --workspace --bins); the
# peers' packages go into target/bench-pack-venv on the first run.
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n '2,9p' "$0" >&2; exit 2; }
rounds=$1
max_tokens=$2
shift 2
cd "$(dirname "$0")/.."
root=$PWD
bin=$root/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release --workspace --bins" >&2; exit 1; }
venv=$root/target/bench-pack-venv
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q transformers datasets grain tokenizers pyarrow numpy >&2
fi
py=$venv/bin/python
corpus=$root/target/bench-pack/corpus
"$py" scripts/bench/pack_corpus.py "$corpus" "$@"
tokenizer=$root/udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json
# max_len replaces the file's truncation at 128 tokens: whole documents.
tokens_sql="SELECT tokenize(text, '$tokenizer', 1000000) AS tokens FROM '$corpus/*.parquet'"
total=$("$bin" --format csv -c "SELECT sum(cardinality(tokens)) AS n, max(cardinality(tokens)) AS longest FROM ($tokens_sql)" | tail -1)
echo "corpus: $total (tokens, longest document) ; max_tokens $max_tokens, 8 sequences per batch, window 10,000 documents"
total_tokens=${total%%,*}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

sqlfeed_run() { # name args...
  local name=$1
  shift
  "$bin" feed "$tokens_sql" --pack "$max_tokens" --batch-size 8 --epochs 1 --device cpu \
    --result-json "$@" >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
  python3 - "$name" "$out" "$total_tokens" <<'PY'
import json, sys
name, path, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path).read()
r = json.loads(next(l for l in text.splitlines() if l.startswith("RESULT "))[7:])
extra = f"  waste {r['padding_frac']:.4f}  worst step {r.get('pack_imbalance', float('nan')):.4f}×"
print(f"{name:<28} {total / r['wall_s']:>12,.0f} tokens/s  first batch {r['ttfb_s']:.2f}s{extra}")
PY
}

peer_run() { # name peer
  "$py" scripts/bench/pack_peers.py "$2" "$corpus" "$tokenizer" "$max_tokens" 8 2>/dev/null >"$out" \
    || { "$py" scripts/bench/pack_peers.py "$2" "$corpus" "$tokenizer" "$max_tokens" 8; exit 1; }
  python3 - "$1" "$out" "$total_tokens" <<'PY'
import json, sys
name, path, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.loads(open(path).read().strip().splitlines()[-1])
waste = f"  waste {r['padding_frac']:.4f}" if "padding_frac" in r else ""
print(f"{name:<28} {total / r['seconds']:>12,.0f} tokens/s  first batch {r['ttfb_s']:.2f}s{waste}")
PY
}

results=$(mktemp)
trap 'rm -f "$out" "$results"' EXIT
for round in $(seq "$rounds"); do
  echo "round $round"
  sqlfeed_run "sqlfeed pack" | tee -a "$results"
  peer_run "hf DataCollatorWithFlattening" hf | tee -a "$results"
  peer_run "grain BestFitPack" grain | tee -a "$results"
  sqlfeed_run "sqlfeed pack, shuffled" --shuffle-seed 42 | tee -a "$results"
  sqlfeed_run "sqlfeed pack, rank 0 of 8" --shuffle-seed 42 --shard 0/8 | tee -a "$results"
done
python3 - "$results" <<'PY'
import collections, re, statistics, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, rate = re.match(r"(.+?)\s{2,}([\d,]+) tokens/s", line).groups()
    rates[name].append(float(rate.replace(",", "")))
def ratio(a, b):
    return statistics.median(x / y for x, y in zip(rates[a], rates[b]))
print(f"sqlfeed ÷ hf {ratio('sqlfeed pack', 'hf DataCollatorWithFlattening'):.2f}×; "
      f"sqlfeed ÷ grain {ratio('sqlfeed pack', 'grain BestFitPack'):.2f}×; "
      f"shuffled ÷ unshuffled {ratio('sqlfeed pack, shuffled', 'sqlfeed pack'):.2f} (medians over rounds)")
PY
