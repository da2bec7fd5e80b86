"""Write alpaca_eval_gpt4_llama2_lengths.csv: the token counts of AlpacaEval's 805 instructions
with GPT-4's answers, formatted as Stanford Alpaca's training script formats an example and
counted with the Llama 2 tokenizer, as a (length, count) histogram.

Sources (both public GitHub repositories; run with the two files at hand, no network):
- the data: tatsu-lab/alpaca_eval, results/gpt4/model_outputs.json at commit
  cd543a149df89434d8a54582c0151c0b945c3d20 (805 items: instruction, GPT-4's output).
- the format: tatsu-lab/stanford_alpaca train.py (commit 761dc5bf):
  PROMPT_DICT["prompt_no_input"] + output + eos, tokenized as one string with the BOS token;
  length = 1 (BOS) + tokens(prompt + output) + 1 (EOS).
- the tokenizer: karpathy/llama2.c tokenizer.bin (commit 350e04fe), Meta's Llama 2
  SentencePiece model exported by its tokenizer.py (pieces, scores; '\u2581' written as ' ').
  It is rebuilt here as Hugging Face `tokenizers` BPE with byte fallback and merges derived
  from the vocabulary (as transformers' LlamaConverter does from the .model file: a merge is
  every split of a piece into two pieces, ranked by the merged piece's score), with the legacy
  normalizer (prepend '\u2581', spaces to '\u2581'), LlamaTokenizerFast's.

Usage: python make_alpaca_eval_lengths.py MODEL_OUTPUTS.json TOKENIZER.bin OUT.csv
"""

from __future__ import annotations

import collections
import json
import struct
import sys

from tokenizers import Tokenizer, models, normalizers

PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:"
)


def read_llama2c_vocab(path: str) -> tuple[list[str], list[float]]:
    """llama2.c tokenizer.bin: max_token_length (uint32), then per token: score (float32),
    length (uint32), UTF-8 bytes."""
    data = open(path, "rb").read()
    (offset, pieces, scores) = (4, [], [])
    while offset < len(data):
        score, n = struct.unpack_from("fI", data, offset)
        offset += 8
        pieces.append(data[offset : offset + n].decode("utf-8"))
        scores.append(score)
        offset += n
    return pieces, scores


def llama2_tokenizer(path: str) -> Tokenizer:
    pieces, scores = read_llama2c_vocab(path)
    pieces[0], pieces[1], pieces[2] = "<unk>", "<s>", "</s>"  # export wrote '\n<s>\n'
    pieces = [p.replace(" ", "\u2581") if i > 2 else p for i, p in enumerate(pieces)]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for piece, pid in vocab.items():
        if pid < 3 or piece.startswith("<0x"):
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((-scores[pid], vocab[left], vocab[right], left, right))
    merges.sort()
    bpe = models.BPE(
        vocab, [(m[3], m[4]) for m in merges], unk_token="<unk>", fuse_unk=True, byte_fallback=True
    )
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    return tok


def main(outputs_path: str, tokenizer_path: str, out_path: str) -> None:
    items = json.load(open(outputs_path, encoding="utf-8"))
    tok = llama2_tokenizer(tokenizer_path)
    texts = [PROMPT_NO_INPUT.format(instruction=x["instruction"]) + x["output"] for x in items]
    lengths = [len(e.ids) + 2 for e in tok.encode_batch(texts, add_special_tokens=False)]
    counts = collections.Counter(lengths)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("length,count\n")
        for length in sorted(counts):
            f.write(f"{length},{counts[length]}\n")
    print(f"{len(lengths)} examples, {len(counts)} distinct lengths, max {max(lengths)}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
