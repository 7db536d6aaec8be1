// Issue 38's request fields with the official `openai` npm client against `specula serve` on the tiny pair
// (drafter on): tools, tool history (an agent loop's second request) and tool_choice as the SDK sends them
// (forced calls and json_schema: structured_output.test.mjs); response_format json_object; stop_token_ids,
// ignore_eos and per-request speculative settings (speculative.n_max, speculative.mode) as extra body
// fields. The tiny KJV model never writes a tool call by itself, so the parsing of calls is tested on
// token sequences in tests/chat (chat_tests) rather than here.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { startServer } from "./harness.mjs";

let server;
let client;
let model;

const tools = [{ type: "function", function: { name: "get_weather", description: "Current weather for a city.",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const history = [
  { role: "user", content: "Weather in Paris?" },
  { role: "assistant", content: null,
    tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: JSON.stringify({ city: "Paris" }) } }] },
  { role: "tool", tool_call_id: "call_1", content: "21 C, clear" },
];

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 30000 });
  model = (await client.models.list()).data[0].id;
});

after(async () => {
  assert.equal(await server.stop(), 0, "specula serve exits 0 on SIGTERM");
});

test("tools and a tool result in the history are accepted; a plain answer has no tool_calls", async () => {
  const r = await client.chat.completions.create({ model, messages: history, tools, tool_choice: "auto",
                                                   parallel_tool_calls: true, max_tokens: 8, temperature: 0 });
  const choice = r.choices[0];
  assert.ok(["stop", "length", "tool_calls"].includes(choice.finish_reason));
  if (choice.finish_reason !== "tool_calls") assert.equal(choice.message.tool_calls, undefined);
  for (const call of choice.message.tool_calls ?? []) {  // should the model call after all: well-formed
    assert.equal(call.type, "function");
    assert.equal(typeof JSON.parse(call.function.arguments), "object");
  }
  // The declarations are part of the prompt: more prompt tokens than without them; "none" drops them.
  const without = await client.chat.completions.create({ model, messages: history, tools, tool_choice: "none", max_tokens: 1 });
  assert.ok(r.usage.prompt_tokens > without.usage.prompt_tokens);
  // Streamed: the same text, no tool-call syntax in any content delta.
  const stream = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 8, temperature: 0, stream: true });
  let text = "";
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      assert.ok(!(c.delta?.content ?? "").includes("<|tool_call>"));
    }
  assert.equal(text, choice.message.content ?? "");
});

test("strict tools are accepted; an orphan tool message is a typed 400", async () => {
  const strict = [{ ...tools[0], function: { ...tools[0].function, strict: true } }];
  const r = await client.chat.completions.create({ model, messages: history, tools: strict, max_tokens: 4 });
  assert.equal(r.choices.length, 1);
  await assert.rejects(client.chat.completions.create({ model, max_tokens: 4,
                                                        messages: [{ role: "user", content: "Hi" }, { role: "tool", tool_call_id: "x", content: "1" }] }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === "messages[1]");
});

test("stop_token_ids, ignore_eos and speculative settings work with the drafter on", async () => {
  const messages = [{ role: "user", content: "And God said" }];
  const base = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
  const answer = base.choices[0].message.content;
  for (const extra of [{ "speculative.n_max": 0 }, { "speculative.mode": "off" }, { "speculative.n_max": 3 },
                       { "speculative.mode": "auto", "speculative.n_max": 4 }, { "speculative.mode": "fixed" }]) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, ...extra });
    assert.equal(r.choices[0].message.content, answer, JSON.stringify(extra));
  }
  const long = await client.chat.completions.create({ model, messages, max_tokens: 40, temperature: 0, ignore_eos: true });
  assert.equal(long.choices[0].finish_reason, "length");
  assert.equal(long.usage.completion_tokens, 40);
  // The answer's second token, as /tokenize gives it (the plain-text tokenization of the answer, which is
  // what the tiny model writes here): generation stops there, "stop", the answer cut before it.
  const ids = await (await fetch(`${server.url}/tokenize`, { method: "POST", headers: { "content-type": "application/json" },
                                                              body: JSON.stringify({ content: answer }) })).json();
  const r = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, stop_token_ids: [ids.tokens[1]] });
  assert.equal(r.choices[0].finish_reason, "stop", JSON.stringify({ r, ids }));
  assert.ok(r.usage.completion_tokens <= 1, JSON.stringify(r));
  await assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 4, "speculative.mode": "sometimes" }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === "speculative.mode");
});

test("response_format json_object: the answer JSON.parse reads as an object, plain and streamed, drafter on", async () => {
  const messages = [{ role: "user", content: "Who was the first king? Answer in JSON." }];
  const r = await client.chat.completions.create({ model, messages, max_tokens: 96, temperature: 0,
                                                   response_format: { type: "json_object" } });
  const content = r.choices[0].message.content;
  if (r.choices[0].finish_reason === "stop") assert.equal(typeof JSON.parse(content), "object", content);
  else assert.ok(content.trimStart().startsWith("{"), content);
  assert.match(r.usage.host_sampling_reason, /json_object/);
  let streamed = "";
  for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 96, temperature: 0,
                                                                    response_format: { type: "json_object" }, stream: true })) {
    streamed += chunk.choices[0]?.delta?.content ?? "";
  }
  assert.equal(streamed, content);
  await assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 4, response_format: { type: "xml" } }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === "response_format");
});

test("presence/frequency penalties and logit_bias keep the drafter on; bad values are typed 400s", async () => {
  const messages = [{ role: "user", content: "And God said" }];
  const fields = { presence_penalty: 0.8, frequency_penalty: 0.5, logit_bias: { "1": -100 } };
  const on = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, ...fields });
  const off = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, ...fields,
                                                     "speculative.mode": "off" });
  assert.equal(on.choices[0].message.content, off.choices[0].message.content);
  for (const [param, value] of [["presence_penalty", 3], ["frequency_penalty", -2.5], ["logit_bias", { "x": 1 }],
                                ["logit_bias", { "5": 200 }]]) {
    await assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 4, [param]: value }),
                         (e) => e instanceof OpenAI.BadRequestError && e.param === param, `${param}: ${JSON.stringify(value)}`);
  }
});

test("logprobs are the same with and without the drafter, plain and streamed", async () => {
  const messages = [{ role: "user", content: "Who made the heaven and the earth?" }];
  const ask = { model, messages, max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 3 };
  const on = await client.chat.completions.create(ask);
  const off = await client.chat.completions.create({ ...ask, "speculative.mode": "off" });
  const a = on.choices[0].logprobs.content, b = off.choices[0].logprobs.content;
  assert.equal(a.length, on.usage.completion_tokens);
  assert.equal(a.length, b.length);
  for (let i = 0; i < a.length; ++i) {
    assert.equal(a[i].token, b[i].token);
    assert.ok(Math.abs(a[i].logprob - b[i].logprob) < 1e-4, `position ${i}: ${a[i].logprob} vs ${b[i].logprob}`);
    assert.equal(a[i].top_logprobs.length, 3);
    assert.deepEqual(a[i].bytes, [...Buffer.from(a[i].token, "utf8")]);
  }
  const streamed = [];
  for await (const chunk of await client.chat.completions.create({ ...ask, stream: true }))
    for (const c of chunk.choices) streamed.push(...(c.logprobs?.content ?? []));
  assert.deepEqual(streamed.map((t) => t.logprob), a.map((t) => t.logprob));
  const legacy = await client.completions.create({ model, prompt: "And the earth was", max_tokens: 6, temperature: 0, logprobs: 2 });
  const l = legacy.choices[0].logprobs;
  assert.equal(l.tokens.length, legacy.usage.completion_tokens);
  assert.equal(l.token_logprobs.length, l.tokens.length);
  assert.equal(l.text_offset.length, l.tokens.length);
});
