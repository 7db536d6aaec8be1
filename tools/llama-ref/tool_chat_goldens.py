#!/usr/bin/env python3
"""Renders tool conversations (OpenAI-style tools, assistant tool_calls, tool messages) with the current
Gemma 4 31B chat template (../shared/gemma4-vocab/google-gemma-4-31B-it.jinja) as Hugging Face
transformers does (jinja2 sandbox, trim_blocks, lstrip_blocks) into tests/chat/data/tool_goldens.json.
Assistant tool-call arguments are handed to the template as mappings (vLLM's chat_utils does the same
with OpenAI's JSON-string arguments); the golden keeps them as the JSON text clients send.
   python3 tools/llama-ref/tool_chat_goldens.py   (needs jinja2)"""
import copy
import json
import pathlib

from jinja2.sandbox import ImmutableSandboxedEnvironment

root = pathlib.Path(__file__).resolve().parents[2]
vocab = root.parent / "shared" / "gemma4-vocab"
template_name = "google-gemma-4-31B-it.jinja"

weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
search = {"type": "function", "function": {
    "name": "search_docs", "description": "Search the documentation.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "description": "Most results", "nullable": True},
        "Tags": {"type": "array", "items": {"type": "string", "description": "a tag"}},
        "filters": {"type": "object", "description": "Narrowing",
                    "properties": {"lang": {"type": "string"}, "year": {"type": "number"}},
                    "required": ["lang"]},
        "rows": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}},
                                            "required": ["id"]}},
        "exact": {"type": "boolean"}},
        "required": ["query", "limit"]}}}
no_params = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
empty_params = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}

def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

conversations = {
    "tools_user": ([weather], [{"role": "user", "content": "Weather in Paris?"}]),
    "tools_system": ([weather, search, no_params, empty_params],
                     [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Find docs"}]),
    "call_pending": ([weather], [{"role": "user", "content": "Weather in Paris?"},
                                 {"role": "assistant", "content": None,
                                  "tool_calls": [call("c1", "get_weather", {"city": "Paris", "unit": "celsius"})]}]),
    "call_and_result": ([weather], [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}]),
    "agent_loop_done": ([weather], [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C, clear"},
        {"role": "assistant", "content": "It is 21 C and clear in Paris."},
        {"role": "user", "content": "Thanks!"}]),
    "parallel_calls": ([weather, search], [
        {"role": "user", "content": "Paris and Rome, and docs on tools"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("a", "get_weather", {"city": "Paris"}), call("b", "get_weather", {"city": "Rome"}),
            call("c", "search_docs", {"query": "tools", "limit": 3, "exact": False, "Tags": ["x", "y"],
                                      "filters": {"lang": "en", "year": 2.5}, "none": None})]},
        {"role": "tool", "tool_call_id": "b", "content": "18 C"},
        {"role": "tool", "tool_call_id": "a", "name": "get_weather", "content": "21 C"},
        {"role": "tool", "tool_call_id": "c", "content": "  3 results  "}]),
    "call_with_text": ([weather], [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call("c1", "get_weather", {"city": "Oslo"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "-3 C"}]),
}

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
template = env.from_string((vocab / template_name).read_text(encoding="utf-8"))
cases = []
for conv, (tools, messages) in conversations.items():
    rendered_messages = copy.deepcopy(messages)
    for m in rendered_messages:
        for tc in m.get("tool_calls") or []:
            tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
    for gen in (True, False):
        for thinking in (False, True):
            rendered = template.render(messages=rendered_messages, tools=tools, bos_token="<bos>", eos_token="<eos>",
                                       add_generation_prompt=gen, enable_thinking=thinking)
            cases.append({"template": template_name, "conversation": conv, "tools": tools, "messages": messages,
                          "add_generation_prompt": gen, "enable_thinking": thinking, "rendered": rendered})
out = root / "tests" / "chat" / "data" / "tool_goldens.json"
out.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
print(f"wrote {len(cases)} cases to {out}")
