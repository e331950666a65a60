#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz entry point into corpus/<name>/seed-*.

Seeds are small (a few KB) valid inputs cut from the repository's fixtures and configs, so the
fuzzer starts from inputs that reach deep into each parser. Re-run after a format change; the
regression inputs (corpus/<name>/regress-*) are checked in by hand and never touched here.
Usage: tests/fuzz/make_seeds.py   (from anywhere)
"""
import gzip
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"
SEP = b"\n#--loom-fuzz-part--#\n"  # kPartSeparator in fuzz_util.h
FIX = ROOT / "tests" / "data" / "fixtures"


def put(name, seed, data):
    d = CORPUS / name
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) <= 8192, (name, seed, len(data))
    (d / f"seed-{seed}").write_bytes(data)


def safetensors(tensors, metadata=None):
    """tensors: name -> (dtype, shape, bytes); laid out in name order."""
    header, buf = {}, b""
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buf), len(buf) + len(data)]}
        buf += data
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + buf


def gpt2_bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    # JSON: documents of every shape the project reads.
    put("json", "fixture_docs", (FIX / "megatron" / "fixture_docs.json").read_bytes())
    cases = (FIX / "tokenizers" / "cases.jsonl").read_text().splitlines()
    put("json", "case", cases[0])
    put("json", "numbers", '{"a":[0,-1,1.5e300,-2.25e-300,9223372036854775807,-9223372036854775808],'
        '"b":{"c":null,"d":true,"e":false},"s":"\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\"}')

    # Config: the run configurations in configs/.
    for toml in sorted((ROOT / "configs").rglob("*.toml")):
        text = toml.read_bytes()
        if len(text) <= 4096:
            put("config", f"{toml.parent.name}-{toml.stem}", text)

    # safetensors: several dtypes, metadata and a shard placement.
    st = safetensors({
        "w": ("F32", [2, 3], struct.pack("<6f", *range(6))),
        "b": ("BF16", [4], b"\x80\x3f" * 4),
        "i": ("I64", [2], struct.pack("<2q", 7, -7)),
        "e": ("F16", [0], b""),
    }, {"format": "pt", "shard.w": json.dumps({"global_shape": [4, 3], "global_offset": [2, 0],
                                                 "replica_id": 0})})
    put("safetensors", "mixed", st)
    put("safetensors", "empty", safetensors({}))

    # Checkpoint: latest, state.json, model and optimizer files.
    state = {"format": "loom.checkpoint", "version": 1, "step": 1, "seed": 42,
             "rng": {"counter": 3}, "data": {"epoch": 0, "sample": 12},
             "config": "[train]\nsteps = 10\n", "fingerprint": "shapes:1:0123456789abcdef",
             "extra": {"loss_scale": 1.0}}
    model = safetensors({"w": ("F32", [2], struct.pack("<2f", 1, 2))})
    optim = safetensors({"w.m": ("F32", [2], struct.pack("<2f", 0, 0))})
    put("ckpt_state", "step1", SEP.join([b"step_00000001\n", json.dumps(state).encode(), model, optim]))

    # Megatron .idx + .bin pairs.
    for kind in ("u16", "i32"):
        mg = FIX / "megatron"
        put("indexed", kind, (mg / f"fixture_{kind}.idx").read_bytes() + SEP +
            (mg / f"fixture_{kind}.bin").read_bytes())

    # GPT-2 tokenizer: the 256 byte tokens, a few merges, <|endoftext|>.
    b2u = gpt2_bytes_to_unicode()
    enc = {b2u[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("ll", "o"), ("H", "e")]
    for a, b in merges:
        enc[a + b] = len(enc)
    enc["<|endoftext|>"] = len(enc)
    vocab = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    put("tokenizer_gpt2", "small", json.dumps(enc, ensure_ascii=False).encode() + SEP + vocab.encode())

    # Hugging Face tokenizer.json over the same small vocabulary: GPT-2's layout (ByteLevel,
    # "a b" merges), and Llama 3's (Split + ByteLevel, ["a", "b"] merges, ignore_merges, added
    # tokens outside the vocabulary).
    def byte_level(use_regex):
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                "use_regex": use_regex}
    hf_vocab = {k: v for k, v in enc.items() if k != "<|endoftext|>"}
    def added(i, content):
        return {"id": i, "content": content, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": True}
    gpt2_hf = {"version": "1.0", "truncation": None, "padding": None,
               "added_tokens": [added(enc["<|endoftext|>"], "<|endoftext|>")],
               "normalizer": None, "pre_tokenizer": byte_level(True), "post_processor": None,
               "decoder": byte_level(True),
               "model": {"type": "BPE", "dropout": None, "unk_token": None,
                         "continuing_subword_prefix": "", "end_of_word_suffix": "",
                         "fuse_unk": False, "byte_fallback": False, "vocab": enc,
                         "merges": [f"{a} {b}" for a, b in merges]}}
    put("tokenizer_hf", "gpt2", json.dumps(gpt2_hf, ensure_ascii=False))
    llama3_re = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    llama3_hf = dict(gpt2_hf)
    llama3_hf["added_tokens"] = [added(300, "<|begin_of_text|>"), added(301, "<|eot_id|>")]
    llama3_hf["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": llama3_re}, "behavior": "Isolated", "invert": False},
        byte_level(False)]}
    llama3_hf["model"] = dict(gpt2_hf["model"], vocab=hf_vocab, ignore_merges=True,
                              merges=[[a, b] for a, b in merges])
    put("tokenizer_hf", "llama3", json.dumps(llama3_hf, ensure_ascii=False))
    # A Unigram model (SentencePiece-style: Metaspace, [piece, score] vocabulary, byte fallback).
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    pieces = ["\u2581", "e", "l", "o", "H", "w", "r", "d", "\u2581He", "llo", "\u2581wor", "ld", "1", "2",
              "3", "\u2581123", "\u00e9", "t", ","]
    uni_vocab = [["<unk>", 0.0], ["<s>", 0.0], ["</s>", 0.0]]
    uni_vocab += [[f"<0x{b:02X}>", 0.0] for b in range(0, 256, 17)]
    uni_vocab += [[p, -1.0 - 0.5 * k] for k, p in enumerate(pieces)]
    unigram_hf = {"version": "1.0", "truncation": None, "padding": None,
                  "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
                  "normalizer": None, "pre_tokenizer": meta,
                  "post_processor": {"type": "TemplateProcessing",
                                     "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                {"Sequence": {"id": "A", "type_id": 0}}]},
                  "decoder": {"type": "Sequence", "decoders": [meta, {"type": "ByteFallback"}]},
                  "model": {"type": "Unigram", "unk_id": 0, "vocab": uni_vocab,
                            "byte_fallback": True}}
    put("tokenizer_hf", "unigram", json.dumps(unigram_hf, ensure_ascii=False))

    # jinja: the chat templates of tests/data/chat_templates/, and a short one using every
    # statement kind.
    for tpl in sorted((ROOT / "tests" / "data" / "chat_templates").glob("*/chat_template.jinja")):
        put("jinja", tpl.parent.name, tpl.read_bytes())
    put("jinja", "statements",
        "{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}{% set ns = namespace(n=0) %}"
        "{%- for x in messages if x.role != 'tool' -%}{% set ns.n = ns.n + 1 %}"
        "{% if loop.first %}{{ m(x.role) }}{% elif x.content is none %}{% continue %}"
        "{% else %}{{ x.content | trim | tojson(indent=2) }}{% endif %}{% endfor %}"
        "{% set b %}{{ tools[0].function.name[::-1] }}{% endset %}{{ b }}{# c #}"
        "{% raw %}{{ x }}{% endraw %}{{ ns.n if ns.n > 1 else raise_exception('few') }}")

    # tiktoken: the first ranks of GPT-2's file, alone and with a sidecar.
    lines = (FIX / "tokenizers" / "gpt2.tiktoken").read_bytes().splitlines(keepends=True)
    ranks = b"".join(lines[:300])
    put("tiktoken", "gpt2-head", ranks)
    sidecar = {"pretokenizer": "cl100k", "special_tokens": {"<|endoftext|>": 300, "<|x|>": 301}}
    put("tiktoken", "gpt2-head-sidecar", ranks + SEP + json.dumps(sidecar).encode())

    # JSONL: good records, a malformed line, missing fields; plain and gzip.
    jsonl = b"".join(json.dumps(r).encode() + b"\n" for r in [
        {"id": "a", "text": "Hello world.", "meta": {"n": 1}},
        {"id": 2, "text": "Second document\nwith two lines."},
        {"text": ""},
        {"id": "no-text"},
    ]) + b"{not json\n\n[1,2]\n"
    put("curate_jsonl", "mixed", jsonl)
    put("curate_jsonl", "mixed-gz", gzip.compress(jsonl, mtime=0))

    def warc(typ, uri, ctype, payload):
        return (f"WARC/1.0\r\nWARC-Type: {typ}\r\nWARC-Target-URI: {uri}\r\n"
                f"WARC-Date: 2024-01-01T00:00:00Z\r\nWARC-Record-ID: <urn:uuid:{uri[-1]}>\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + \
            payload + b"\r\n\r\n"
    html = b"<html><body><p>Hello from the web.</p></body></html>"
    w = (warc("warcinfo", "urn:info:0", "application/warc-fields", b"software: test\r\n") +
         warc("request", "http://a.example/1", "application/http; msgtype=request", b"GET / HTTP/1.1\r\n\r\n") +
         warc("response", "http://a.example/2", "application/http; msgtype=response",
              b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n" + html) +
         warc("conversion", "http://a.example/3", "text/plain", b"Plain text of a page.\n") +
         warc("response", "http://a.example/4", "application/http; msgtype=response",
              b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n\r\n\x89PNG"))
    put("curate_warc", "records", w)
    put("curate_warc", "records-gz", gzip.compress(w, mtime=0))

    # Chat data and preference pairs: every form a line may take, and a bad one of each kind.
    put("chat_data", "chat", "\n".join([
        '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi \\u00e9"}, '
        '{"role": "assistant", "content": "yo"}]}',
        '{"prompt": "2+2=", "completion": "4"}',
        '{"messages": [{"role": "robot", "content": "x"}]}']) + "\n")
    put("chat_data", "pairs", "\n".join([
        '{"prompt": "rev abc", "chosen": "cba", "rejected": "zzzz"}',
        '{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "yo"}], '
        '"rejected": "no"}',
        '{"prompt": "x", "chosen": "same", "rejected": "same"}']) + "\n")

    # Supervisor lines: a bound byte, then a launcher's output (tags, errors, mpirun's report,
    # heartbeats, a long line, bytes that are not UTF-8).
    hello = ('{"ev":"hello","token":"t","attempt":0,"rank":1,"world":2,"pid":7,"host":"h",'
             '"run_dir":"/r","setup_seconds":1.5}')
    put("supervisor_lines", "launcher", b"\x40" + "\n".join([
        "[1,0]<stdout>:step 1 loss 4.2", "[1,1]<stderr>:loom train: error: no such preset 'x'",
        "[1,1]<stdout>:loom: rank 1 failed: out of memory",
        "Primary job terminated: process rank 1 with PID 42",
        "  Process name: [[4711,1],3]", hello, '{"ev":"section","step":3,"name":"data"}',
        '{"ev":"step","step":3,"seconds":0.02}', '{"ev":"bye"}']).encode() +
        b"\n[1,0]<stdout>:" + b"x" * 300 + b"\xe2\x82\xac\xff\x00\r\n")

    # HTML: the curate test pages.
    for page in sorted((ROOT / "tests" / "curate" / "data" / "html").rglob("*.htm*")):
        put("html", page.stem, page.read_bytes())


if __name__ == "__main__":
    main()
