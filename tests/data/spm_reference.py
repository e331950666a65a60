"""Writes what the SentencePiece library (python3-sentencepiece) gives for every text of a corpus
with each tokenizer.model, in the lines hf_tokenizer_parity reads: the ids without and with <s>
in front, and the decoding of the latter. Control pieces and <unk> written in the text are their
own ids and the text between them is encoded piece by piece, as Hugging Face's LlamaTokenizer
splits its special tokens out.
Usage: /usr/bin/python3 spm_reference.py CORPUS.json OUT.jsonl MODEL.model..."""
import json
import re
import sys

import sentencepiece as spm

corpus_path, out_path, *models = sys.argv[1:]
corpus = json.load(open(corpus_path, encoding="utf-8"))
lines = []
for model in models:
    sp = spm.SentencePieceProcessor(model_file=model)
    specials = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())
                if sp.is_control(i) or sp.is_unknown(i)}
    cut = re.compile("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")
    for i, text in enumerate(corpus):
        plain = []
        for k, part in enumerate(cut.split(text)):
            if k % 2:
                plain.append(specials[part])
            elif part:
                plain += sp.encode(part)
        special = ([sp.bos_id()] if sp.bos_id() >= 0 else []) + plain
        lines.append(json.dumps({"model": "spm:" + model, "i": i, "plain": plain,
                                 "special": special, "decoded": sp.decode(special)}))
with open(out_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
