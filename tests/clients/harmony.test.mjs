// harmony, gpt-oss's chat format, served: the kit's tiny gpt-oss model under the real
// gpt-oss template (../shared/conformance/templates), through all three doors. The reply
// parser maps the analysis channel to reasoning, final to content and a commentary
// message to `functions.NAME` to a tool call, streamed and whole; tool_choice required is
// enforced in harmony's syntax by the grammar (the model writes the call itself, after a
// forced analysis message), and with auto once the model opens a call; reasoning_effort
// reaches the template; a reply that is not harmony reaches the client as text.
//
// Replies with channels use the test-only tern_forced_output (a random model emits no
// harmony by itself): the engine emits exactly those tokens, through the real
// detokenizer, reply parser and each protocol's renderer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { existsSync } from 'node:fs';
import { startServer, requireOpenAI, sourceDir, sseFrames, skip } from './harness.mjs';

const require = createRequire(join(sourceDir, 'third_party', 'package.json'));
requireOpenAI();
const { default: OpenAI } = require('openai');
const { default: Anthropic } = require('@anthropic-ai/sdk');

const shared = process.env.TERN_SHARED_DIR || process.env.TERN_SHARED_DIR_DEFAULT;
const model = shared && join(shared, 'models', 'tiny-gptoss-mxfp4.gguf');
const template = shared && join(shared, 'conformance', 'templates', 'templates', 'gpt-oss-120b.jinja');
if (!model || !existsSync(model) || !existsSync(template)) {
  if ((process.env.TERN_REQUIRE_SHARED || '0') !== '0') throw new Error(`no ${model} or ${template}`);
  skip('no ../shared (TERN_SHARED_DIR): the tiny gpt-oss model and its template');
}

let srv, openai, anthropic;
before(async () => {
  srv = await startServer(['--model', model, '--chat-template', template, '--ctx-size', '4096', '--predict', 'off'],
    { TERN_TEST_FORCED_OUTPUT: '1' });
  openai = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'x', maxRetries: 0, timeout: 60000 });
  anthropic = new Anthropic({ baseURL: srv.base, apiKey: 'x', maxRetries: 0, timeout: 60000 });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0);
});

const TOOLS = [
  { type: 'function', function: { name: 'read_file', description: 'Read a file',
    parameters: { type: 'object', properties: { path: { type: 'string', maxLength: 12 } }, required: ['path'], additionalProperties: false } } },
  { type: 'function', function: { name: 'ls', description: 'List a folder',
    parameters: { type: 'object', properties: {}, additionalProperties: false } } },
];
const ANSWER = '<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!';
const CALL = '<|channel|>analysis<|message|>Need the file.<|end|><|start|>assistant<|channel|>commentary '
  + 'to=functions.read_file <|constrain|>json<|message|>{"path":"a.c"}';
const msgs = [{ role: 'user', content: 'Hi' }];

test('chat completions: analysis is reasoning_content, final is content, streamed and whole alike', async () => {
  const r = await openai.chat.completions.create({ model: 'tern', messages: msgs, max_tokens: 400, tern_forced_output: ANSWER });
  const m = r.choices[0].message;
  assert.equal(m.content, 'Hello there!');
  assert.equal(m.reasoning_content, 'The user greets me.');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await openai.chat.completions.create({ model: 'tern', messages: msgs, max_tokens: 400, stream: true,
    tern_forced_output: ANSWER });
  let content = '', reasoning = '';
  for await (const c of s) {
    const d = c.choices[0]?.delta || {};
    content += d.content || '';
    reasoning += d.reasoning_content || '';
    assert.ok(!/<\|/.test(d.content || '') && !/<\|/.test(d.reasoning_content || ''), JSON.stringify(d));
  }
  assert.equal(content, m.content);
  assert.equal(reasoning, m.reasoning_content);
});

test('chat completions: a commentary message to functions.NAME is a tool call', async () => {
  const r = await openai.chat.completions.create({ model: 'tern', messages: msgs, tools: TOOLS, max_tokens: 400,
    tern_forced_output: CALL });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.reasoning_content, 'Need the file.');
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'read_file');
  assert.deepEqual(JSON.parse(c.message.tool_calls[0].function.arguments), { path: 'a.c' });
  // the call goes back into the conversation: the template renders it in harmony
  const back = await openai.chat.completions.create({ model: 'tern', max_tokens: 4, tools: TOOLS, messages: [
    ...msgs, { role: 'assistant', content: null, reasoning_content: 'Need the file.', tool_calls: c.message.tool_calls },
    { role: 'tool', tool_call_id: c.message.tool_calls[0].id, content: 'int main;' }] });
  assert.ok(back.usage.prompt_tokens > r.usage.prompt_tokens);
});

test('tool_choice required: the model writes the call in harmony syntax, valid by construction', async () => {
  for (const [choice, name] of [['required', null], [{ type: 'function', function: { name: 'read_file' } }, 'read_file']]) {
    const r = await openai.chat.completions.create({ model: 'tern', messages: msgs, tools: TOOLS, tool_choice: choice,
      max_tokens: 120, temperature: 0,
      tern_forced_prefix: '<|channel|>analysis<|message|>Pick a tool.<|end|><|start|>assistant' });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
    assert.equal(c.message.reasoning_content, 'Pick a tool.');
    const call = c.message.tool_calls[0];
    if (name) assert.equal(call.function.name, name);
    assert.ok(['read_file', 'ls'].includes(call.function.name));
    const args = JSON.parse(call.function.arguments);
    if (call.function.name === 'read_file') assert.ok(typeof args.path === 'string' && args.path.length <= 12);
  }
});

test('tool_choice auto: a call the model opens is held to the tools\' schemas from there (lazy)', async () => {
  // sampled at temperature 1 with three seeds: a random model writes valid calls only
  // because the grammar takes over once it has opened one
  for (const seed of [1, 2, 3]) {
    const r = await openai.chat.completions.create({ model: 'tern', messages: msgs, tools: TOOLS, max_tokens: 120,
      temperature: 1, seed, tern_forced_prefix: '<|channel|>commentary to=functions.' });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
    const call = c.message.tool_calls[0];
    assert.ok(['read_file', 'ls'].includes(call.function.name));
    const args = JSON.parse(call.function.arguments);
    if (call.function.name === 'read_file') assert.ok(typeof args.path === 'string' && args.path.length <= 12);
    else assert.deepEqual(args, {});
  }
});

test('reasoning_effort reaches the template; a reply that is not harmony is text', async () => {
  const count = async (extra) => (await openai.chat.completions.create({ model: 'tern', messages: msgs, max_tokens: 1,
    ...extra })).usage.prompt_tokens;
  // "Reasoning: low" and "Reasoning: high" render to different prompts than the default
  const [dflt, low] = [await count({}), await count({ reasoning_effort: 'low' })];
  const lowKw = await count({ chat_template_kwargs: { reasoning_effort: 'low' } });
  assert.equal(low, lowKw);
  assert.notEqual(await count({ reasoning_effort: 'a-much-longer-effort-name' }), dflt);
  const r = await openai.chat.completions.create({ model: 'tern', messages: msgs, max_tokens: 400,
    tern_forced_output: 'plain words <|chan' });
  assert.equal(r.choices[0].message.content, 'plain words <|chan');
});

test('messages: a thinking block and a tool_use block', async () => {
  const r = await anthropic.messages.create({ model: 'tern', max_tokens: 400, messages: [{ role: 'user', content: 'Hi' }],
    tools: TOOLS.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters })),
    tern_forced_output: CALL });
  assert.equal(r.stop_reason, 'tool_use');
  assert.deepEqual(r.content.map((b) => b.type), ['thinking', 'tool_use']);
  assert.equal(r.content[0].thinking, 'Need the file.');
  assert.equal(r.content[1].name, 'read_file');
  assert.deepEqual(r.content[1].input, { path: 'a.c' });
});

test('responses: a reasoning item and a function_call, streamed', async () => {
  const res = await fetch(srv.base + '/v1/responses', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tern', input: 'Hi', stream: true, max_output_tokens: 400, tern_forced_output: CALL,
      tools: TOOLS.map((t) => ({ type: 'function', name: t.function.name, description: t.function.description,
        parameters: t.function.parameters })) }) });
  assert.equal(res.status, 200);
  const events = sseFrames(await res.text()).filter((f) => f.data).map((f) => JSON.parse(f.data));
  const done = events.find((e) => e.type === 'response.completed').response;
  assert.deepEqual(done.output.map((o) => o.type), ['reasoning', 'function_call']);
  assert.equal(done.output[1].name, 'read_file');
  assert.deepEqual(JSON.parse(done.output[1].arguments), { path: 'a.c' });
  const text = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
  assert.equal(text, 'Need the file.');
});
