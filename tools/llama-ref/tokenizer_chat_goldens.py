#!/usr/bin/env python3
"""Renders Gemma 4 chat templates (../shared/gemma4-vocab/*.jinja) with jinja2 the way Hugging Face
transformers does (sandboxed, trim_blocks, lstrip_blocks) into tests/chat/data/chat_goldens.json.
   python3 tools/llama-ref/tokenizer_chat_goldens.py   (needs python3-jinja2)"""
import json
import pathlib

from jinja2.sandbox import ImmutableSandboxedEnvironment

root = pathlib.Path(__file__).resolve().parents[2]
vocab = root.parent / "shared" / "gemma4-vocab"
templates = ["google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"]

conversations = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are concise."},
                    {"role": "user", "content": "What is the capital of France?"}],
    "developer_first": [{"role": "developer", "content": "Answer in French."},
                        {"role": "user", "content": "Hi"}],
    "multi_turn": [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4"},
                   {"role": "user", "content": "And 3+3?"}],
    "assistant_thinking_stripped": [
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "<|channel>thought\nRayleigh scattering.<channel|>Because of Rayleigh scattering."},
        {"role": "user", "content": "Thanks"}],
    "whitespace_trimmed": [{"role": "system", "content": "\n  Trim me \t\n"},
                           {"role": "user", "content": "\u3000 padded\u00a0text \n\n"},
                           {"role": "assistant", "content": "  spaced answer  "},
                           {"role": "user", "content": "  multi\nline\n\n  text  "}],
    "consecutive_assistant": [{"role": "user", "content": "Tell me two things."},
                              {"role": "assistant", "content": "First."},
                              {"role": "assistant", "content": "Second."},
                              {"role": "user", "content": "Ok"}],
    "unicode_content": [{"role": "user", "content": "Grüße 🦙 нещо на Български, 日本語 <b>tags</b> & \"quotes\""}],
    "empty_content": [{"role": "user", "content": ""}],
    "ends_with_assistant": [{"role": "user", "content": "Say hi"},
                            {"role": "assistant", "content": "Hi there!"}],
}

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
cases = []
for name in templates:
    template = env.from_string((vocab / name).read_text(encoding="utf-8"))
    for conv, messages in conversations.items():
        for gen in (True, False):
            for thinking in (False, True):
                rendered = template.render(messages=messages, bos_token="<bos>", eos_token="<eos>",
                                           add_generation_prompt=gen, enable_thinking=thinking)
                cases.append({"template": name, "conversation": conv, "messages": messages,
                              "add_generation_prompt": gen, "enable_thinking": thinking, "rendered": rendered})
out = root / "tests" / "chat" / "data" / "chat_goldens.json"
out.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
print(f"wrote {len(cases)} cases to {out}")
