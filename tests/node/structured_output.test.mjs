// Constrained decoding through the official `openai` npm client against `specula serve` on the tiny pair
// (drafter on): response_format json_schema for 20 schemas, each answer parsed and validated with ajv;
// vLLM's guided_regex and llama-server's grammar as extra body fields; tool_choice "required" and named
// forcing a Gemma 4 tool call whose arguments validate against the tool's parameters; an agent loop
// (forced call -> tool result -> final answer). The tiny KJV model knows nothing of JSON: every answer
// here is valid because the masks allow nothing else.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import Ajv from "ajv";
import OpenAI from "openai";
import { startServer } from "./harness.mjs";

let server;
let client;
let model;
const ajv = new Ajv({ strict: false, validateFormats: false });  // formats are checked below by pattern

const str = (max) => ({ type: "string", maxLength: max });
const object = (properties, required = Object.keys(properties)) => ({ type: "object", properties, required, additionalProperties: false });
const point = object({ x: { type: "integer", minimum: -9, maximum: 9 }, y: { type: "integer", minimum: -9, maximum: 9 } });

const schemas = {
  person: object({ name: str(20), age: { type: "integer", minimum: 0, maximum: 150 } }),
  enum: object({ color: { enum: ["red", "green", "blue"] } }),
  const: object({ kind: { const: "king" }, reign: { type: "integer", minimum: 1, maximum: 99 } }),
  nested: object({ person: object({ name: str(12), address: object({ city: str(12), zip: { type: "string", pattern: "^[0-9]{5}$" } }) }) }),
  string_array: object({ names: { type: "array", items: str(10), minItems: 1, maxItems: 3 } }),
  object_array: object({ items: { type: "array", items: object({ id: { type: "integer", minimum: 1, maximum: 999 }, ok: { type: "boolean" } }), maxItems: 3 } }),
  optional: object({ a: str(8), b: str(8), c: { type: "integer", minimum: 0, maximum: 9 } }, ["a"]),
  unit_interval: object({ score: { type: "number", minimum: 0, maximum: 1 } }),
  exclusive: object({ n: { type: "integer", exclusiveMinimum: 10, exclusiveMaximum: 20 } }),
  negative: object({ t: { type: "integer", minimum: -50, maximum: -10 } }),
  pattern: object({ code: { type: "string", pattern: "^[A-Z]{3}-[0-9]{3}$" } }),
  length: object({ s: { type: "string", minLength: 2, maxLength: 5 } }),
  date: object({ day: { type: "string", format: "date" } }),
  uuid: object({ id: { type: "string", format: "uuid" } }),
  any_of: object({ v: { anyOf: [{ type: "integer", minimum: 0, maximum: 99 }, str(5)] } }),
  refs: { $defs: { point }, ...object({ from: { $ref: "#/$defs/point" }, to: { $ref: "#/$defs/point" } }) },
  nullable: object({ x: { type: ["string", "null"], maxLength: 8 } }),
  top_array: { type: "array", items: { type: "integer", minimum: 0, maximum: 9 }, minItems: 2, maxItems: 4 },
  literals: object({ flag: { type: "boolean" }, nothing: { type: "null" } }),
  enum_array: object({ tags: { type: "array", items: { enum: ["a", "b", "c"] }, minItems: 1, maxItems: 3 }, level: { enum: [1, 2, 3] } }),
};
const formats = { date: /^\d{4}-\d{2}-\d{2}$/, uuid: /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i };

const tools = [{ type: "function", function: { name: "get_weather", description: "Current weather for a city.",
  parameters: object({ city: str(16), days: { type: "integer", minimum: 1, maximum: 7 }, unit: { enum: ["c", "f"] } }, ["city", "days"]) } },
                { type: "function", function: { name: "get_time", description: "The time in a city.", parameters: object({ city: str(16) }) } }];

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60000 });
  model = (await client.models.list()).data[0].id;
});

after(async () => {
  assert.equal(await server.stop(), 0, "specula serve exits 0 on SIGTERM");
});

test("response_format json_schema: 20 schemas, every answer parses and validates (drafter on)", async () => {
  assert.equal(Object.keys(schemas).length, 20);
  for (const [name, schema] of Object.entries(schemas)) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: "user", content: `Answer as JSON (${name}).` }], max_tokens: 300, temperature: 0,
      response_format: { type: "json_schema", json_schema: { name, schema, strict: true } } });
    const content = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, "stop", `${name}: ${content}`);
    const value = JSON.parse(content);
    assert.ok(ajv.validate(schema, value), `${name}: ${content}: ${JSON.stringify(ajv.errors)}`);
    if (name === "person") assert.deepEqual(Object.keys(value), ["name", "age"], "keys in the schema's order");
    if (name === "date") assert.match(value.day, formats.date);
    if (name === "uuid") assert.match(value.id, formats.uuid);
    assert.match(r.usage.host_sampling_reason, /json_schema/, name);
  }
});

test("json_schema sampled (temperature 1) and streamed answers validate too", async () => {
  for (const name of ["person", "object_array", "pattern", "any_of"]) {
    const schema = schemas[name];
    let text = "";
    for await (const chunk of await client.chat.completions.create({
      model, messages: [{ role: "user", content: "JSON please." }], max_tokens: 300, temperature: 1, seed: 3, stream: true,
      response_format: { type: "json_schema", json_schema: { name, schema } } })) {
      text += chunk.choices[0]?.delta?.content ?? "";
    }
    assert.ok(ajv.validate(schema, JSON.parse(text)), `${name}: ${text}`);
  }
});

test("guided_regex, guided_json and grammar as extra body fields; bad ones are typed 400s", async () => {
  const messages = [{ role: "user", content: "A date?" }];
  const regex = await client.chat.completions.create({ model, messages, max_tokens: 40, temperature: 0, guided_regex: "(19|20)[0-9]{2}-(0[1-9]|1[0-2])" });
  assert.match(regex.choices[0].message.content, /^(19|20)[0-9]{2}-(0[1-9]|1[0-2])$/);
  const grammar = await client.completions.create({ model, prompt: "The answer is", max_tokens: 10, temperature: 0,
                                                    grammar: 'root ::= (" yes" | " no") "."' });
  assert.match(grammar.choices[0].text, /^ (yes|no)\.$/);
  const guided = await client.chat.completions.create({ model, messages, max_tokens: 60, temperature: 0, guided_json: schemas.enum });
  assert.ok(ajv.validate(schemas.enum, JSON.parse(guided.choices[0].message.content)));
  const bad = async (body, param, pattern) =>
    assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 4, ...body }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.param, param);
      assert.match(e.message, pattern);
      return true;
    });
  await bad({ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", not: {} } } } },
            "response_format.json_schema.schema", /not/);
  await bad({ guided_regex: "(a" }, "guided_regex", /.+/);
  await bad({ grammar: "root ::= undefined-rule" }, "grammar", /never defined/);
  await bad({ grammar: 'root ::= "a"', guided_regex: "a" }, "grammar", /both constrain/);
});

test("tool_choice required and named force a call whose arguments validate against the tool's schema", async () => {
  const messages = [{ role: "user", content: "What is the weather in Paris for three days?" }];
  for (const tool_choice of ["required", { type: "function", function: { name: "get_weather" } },
                             { type: "function", function: { name: "get_time" } }]) {
    const r = await client.chat.completions.create({ model, messages, tools, tool_choice, max_tokens: 120, temperature: 0,
                                                     parallel_tool_calls: false });
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(r));
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0].function;
    if (typeof tool_choice === "object") assert.equal(call.name, tool_choice.function.name);
    const tool = tools.find((t) => t.function.name === call.name);
    assert.ok(tool, call.name);
    assert.ok(ajv.validate(tool.function.parameters, JSON.parse(call.arguments)), `${call.arguments}: ${JSON.stringify(ajv.errors)}`);
    assert.match(r.usage.host_sampling_reason, /tool_choice/);
  }
  await assert.rejects(client.chat.completions.create({ model, messages, tools, max_tokens: 4,
                                                        tool_choice: { type: "function", function: { name: "nope" } } }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === "tool_choice" && /nope/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model, messages, tool_choice: "required", max_tokens: 4 }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === "tool_choice");
});

test("an agent loop: forced call, tool result, final answer", async () => {
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  const first = await client.chat.completions.create({ model, messages, tools, tool_choice: { type: "function", function: { name: "get_weather" } },
                                                       max_tokens: 120, temperature: 0 });
  const call = first.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  messages.push(first.choices[0].message);
  messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature_c: 21, sky: "clear" }) });
  const second = await client.chat.completions.create({ model, messages, tools, max_tokens: 24, temperature: 0 });
  assert.ok(["stop", "length", "tool_calls"].includes(second.choices[0].finish_reason));
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
  if (second.choices[0].finish_reason !== "tool_calls") assert.equal(typeof second.choices[0].message.content, "string");
});
