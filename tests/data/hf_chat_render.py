#!/usr/bin/python3
"""Renders chat templates as Hugging Face's apply_chat_template does, with Debian's jinja2: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls, HF's tojson
(json.dumps with ensure_ascii=False), raise_exception and strftime_now (its clock fixed to the
case's `now`). Reads a JSON list of cases from argv[1], writes the JSON list of rendered texts
(or "ERROR: <exception>" where rendering raised) to stdout.

A case: {"path": DIR | tokenizer_config.json | FILE.jinja, "messages": [...], "tools": [...]?,
"add_generation_prompt": bool, "extra": {...}?, "now": epoch seconds}, or {"source": TEXT,
"vars": {...}} for a bare template."""
import json
import os
import sys
from datetime import datetime

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: renders its body (HF tracks it for masks)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise TemplateError(message)


def environment(now):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.fromtimestamp(now).strftime(fmt)
    return env


def token_text(cfg, key):
    t = cfg.get(key)
    if isinstance(t, dict):
        t = t.get("content")
    return t


def load(path, with_tools):
    cfg = {}
    config = os.path.join(path, "tokenizer_config.json") if os.path.isdir(path) else path
    jinja_file = os.path.join(path, "chat_template.jinja") if os.path.isdir(path) else path
    if config.endswith(".json") and os.path.exists(config):
        with open(config, encoding="utf-8") as f:
            cfg = json.load(f)
    if jinja_file.endswith(".jinja") and os.path.exists(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            source = f.read()
    else:
        source = cfg["chat_template"]
        if isinstance(source, list):
            named = {t["name"]: t["template"] for t in source}
            source = named["tool_use"] if with_tools and "tool_use" in named else named["default"]
    special = {k: token_text(cfg, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return source, {k: v for k, v in special.items() if v is not None}


def render(case):
    env = environment(case.get("now", 0))
    if "source" in case:
        return env.from_string(case["source"]).render(**case.get("vars", {}))
    source, special = load(case["path"], bool(case.get("tools")))
    return env.from_string(source).render(
        messages=case["messages"], tools=case.get("tools"), documents=None,
        add_generation_prompt=case["add_generation_prompt"], **special, **case.get("extra", {}))


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for case in cases:
        try:
            out.append(render(case))
        except Exception as e:  # what apply_chat_template would raise (TemplateError, TypeError)
            out.append(f"ERROR: {type(e).__name__}: {e}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
