// The official `openai` npm client against `specula serve` on the shipped tiny pair (configs/default.yaml,
// drafter on): models, plain and streamed chat and completions (the streamed pieces concatenate to the
// plain answer at temperature 0), usage, stop strings, and the SDK's typed errors for bad requests, after
// which the server still serves. Run by CTest (tests/CMakeLists.txt) with node's test runner.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { startServer } from "./harness.mjs";

let server;
let client;
let model;
const question = [{ role: "user", content: "Who made the heaven and the earth?" }];

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 30000 });
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  model = models.data[0].id;
});

after(async () => {
  assert.equal(await server.stop(), 0, "specula serve exits 0 on SIGTERM");
});

async function streamedText(stream) {
  let text = "";
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? c.text ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage };
}

test("models lists the served model as its id", async () => {
  assert.equal(model, "specula-tiny-kjv-q8_0");
  const m = await client.models.retrieve(model).catch((e) => e);
  // GET /v1/models/{id} is optional in the OpenAI API; it answers the model or a typed 404, never garbage.
  if (m instanceof Error) assert.equal(m.status, 404);
  else assert.equal(m.id, model);
});

test("chat: the streamed pieces concatenate to the plain answer, with usage last", async () => {
  const plain = await client.chat.completions.create({ model, messages: question, max_tokens: 24, temperature: 0 });
  assert.equal(plain.object, "chat.completion");
  assert.equal(plain.choices.length, 1);
  assert.equal(plain.choices[0].message.role, "assistant");
  const answer = plain.choices[0].message.content;
  assert.ok(answer.length > 0, "a non-empty answer");
  assert.ok(["stop", "length"].includes(plain.choices[0].finish_reason));
  assert.ok(plain.usage.prompt_tokens > 0);
  assert.ok(plain.usage.completion_tokens > 0 && plain.usage.completion_tokens <= 24);
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);

  const stream = await client.chat.completions.create({ model, messages: question, max_tokens: 24, temperature: 0,
                                                        stream: true, stream_options: { include_usage: true } });
  const s = await streamedText(stream);
  assert.equal(s.text, answer);
  assert.equal(s.finish, plain.choices[0].finish_reason);
  assert.deepEqual(s.usage.completion_tokens, plain.usage.completion_tokens);
});

test("completions: the raw prompt is continued, plain and streamed alike", async () => {
  const prompt = "In the beginning God created";
  const plain = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0 });
  assert.equal(plain.object, "text_completion");
  assert.ok(plain.choices[0].text.length > 0);
  const s = await streamedText(await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0, stream: true }));
  assert.equal(s.text, plain.choices[0].text);
});

test("a stop string cuts the answer before it", async () => {
  const full = await client.chat.completions.create({ model, messages: question, max_tokens: 24, temperature: 0 });
  const text = full.choices[0].message.content;
  const stop = text.trim().split(/\s+/)[1];  // the second word of the answer
  assert.ok(stop, `an answer of two words or more: ${JSON.stringify(text)}`);
  const cut = await client.chat.completions.create({ model, messages: question, max_tokens: 24, temperature: 0, stop: [stop] });
  assert.equal(cut.choices[0].finish_reason, "stop");
  assert.equal(cut.choices[0].message.content, text.slice(0, text.indexOf(stop)));
});

test("bad requests are the SDK's typed errors and the server keeps serving", async () => {
  const bad = (body) => client.chat.completions.create({ model, messages: question, max_tokens: 8, ...body });
  await assert.rejects(bad({ model: "no-such-model" }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    assert.equal(e.code, "model_not_found");
    return true;
  });
  await assert.rejects(bad({ temperature: 7 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.param, "temperature");
    assert.match(e.message, /temperature/);
    return true;
  });
  await assert.rejects(bad({ max_tokens: 10000000 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.code, "context_length_exceeded");
    return true;
  });
  await assert.rejects(bad({ n: 17 }), (e) => e instanceof OpenAI.BadRequestError && e.param === "n");
  await assert.rejects(bad({ messages: "not a list" }), (e) => e instanceof OpenAI.BadRequestError && e.param === "messages");
  const ok = await bad({ temperature: 0 });
  assert.ok(ok.choices[0].message.content.length > 0);
});

test("n choices: chat and completions, plain and streamed, each choice its own seed", async () => {
  const messages = [{ role: "user", content: "Who made the heaven and the earth?" }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1, seed: 7, n: 4 });
  assert.deepEqual(chat.choices.map((c) => c.index), [0, 1, 2, 3]);
  const texts = chat.choices.map((c) => c.message.content);
  assert.ok(new Set(texts).size > 1, `sampled choices differ: ${JSON.stringify(texts)}`);
  const again = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1, seed: 7, n: 4 });
  assert.deepEqual(again.choices.map((c) => c.message.content), texts, "the same seed, the same choices");
  const one = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1, seed: 8 });
  assert.equal(chat.usage.prompt_tokens, one.usage.prompt_tokens, "the prompt counted once");
  assert.ok(chat.usage.completion_tokens > 12 && chat.usage.completion_tokens <= 48, JSON.stringify(chat.usage));
  const completions = await client.completions.create({ model, prompt: "In the beginning", max_tokens: 8, temperature: 0, n: 2 });
  assert.deepEqual(completions.choices.map((c) => c.index), [0, 1]);
  assert.equal(completions.choices[0].text, completions.choices[1].text, "greedy choices are equal");
  // Streamed: each index gets its role, its text and one finish chunk; the pieces add up to the plain answers.
  const pieces = ["", "", ""], finished = [0, 0, 0], roles = [0, 0, 0];
  let usage = null;
  for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1, seed: 7, n: 3,
                                                                   stream: true, stream_options: { include_usage: true } })) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta?.role) roles[c.index]++;
      pieces[c.index] += c.delta?.content ?? "";
      if (c.finish_reason) finished[c.index]++;
    }
  }
  assert.deepEqual(roles, [1, 1, 1]);
  assert.deepEqual(finished, [1, 1, 1]);
  assert.deepEqual(pieces, texts.slice(0, 3));
  assert.ok(usage.completion_tokens > 12 && usage.completion_tokens <= 36, JSON.stringify(usage));
});
