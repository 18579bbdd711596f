// tern serve driven by the official openai npm package (third_party/package.json pins
// the version): non-streaming, streaming with usage, a tool round trip whose streamed
// tool_calls the SDK reassembles, reasoning_content, errors as the SDK's error classes.
//
// A random-weight model never emits a tool call by itself, so the tool and reasoning
// tests use the test-only request field tern_forced_output (enabled by
// TERN_TEST_FORCED_OUTPUT=1): the engine emits exactly those tokens, through the real
// detokenizer, output parser and SSE path. See docs/SERVING.md.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { makeModel, startServer, tmp, requireOpenAI, sourceDir } from './harness.mjs';

const require = createRequire(join(sourceDir, 'third_party', 'package.json'));
requireOpenAI();
const { default: OpenAI } = require('openai');

let srv, client;
const KEY = 'test-key-1';

before(async () => {
  const dir = tmp();
  const model = makeModel(dir);
  srv = await startServer(['--model', model, '--ctx-size', '2048', '--api-key', KEY, '--max-body', '1000000'],
    { TERN_TEST_FORCED_OUTPUT: '1' });
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: KEY, maxRetries: 0, timeout: 60000 });
});
after(async () => { if (srv) assert.equal(await srv.stop(), 0); });

const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hi.' }];

test('non-streaming', async () => {
  const r = await client.chat.completions.create({ model: 'tern', messages: msgs, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const models = await client.models.list();
  assert.ok(models.data.length === 1 && typeof models.data[0].id === 'string');
});

test('streaming with usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'tern', messages: msgs, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null, finish = null, chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.delta?.content ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.ok(chunks >= 3);
  assert.ok(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= 8);
  assert.ok(['stop', 'length'].includes(finish));
  const whole = await client.chat.completions.create({ model: 'tern', messages: msgs, max_tokens: 8, temperature: 0 });
  assert.equal(text, whole.choices[0].message.content ?? '');
});

test('tool round trip: streamed tool_calls reassembled by the SDK', async () => {
  const tools = [
    { type: 'function', function: { name: 'read_file', description: 'Read a file',
      parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } } },
    { type: 'function', function: { name: 'list_dir' } }, // no parameters at all
  ];
  const messages = [{ role: 'user', content: [{ type: 'text', text: 'Show me' }, { type: 'text', text: 'README.md' }] }];
  const runner = client.chat.completions.stream({
    model: 'tern', messages, tools, max_tokens: 200,
    tern_forced_output: '<tool_call>\n{"name": "read_file", "arguments": {"path": "README.md"}}\n</tool_call>\n'
      + '<tool_call>\n{"name": "list_dir", "arguments": {}}\n</tool_call>',
  });
  const final = await runner.finalChatCompletion();
  const m = final.choices[0].message;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.tool_calls.length, 2);
  assert.equal(m.tool_calls[0].function.name, 'read_file');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { path: 'README.md' });
  assert.equal(m.tool_calls[1].function.name, 'list_dir');
  assert.notEqual(m.tool_calls[0].id, m.tool_calls[1].id);
  // send the results back, as an agent does
  const next = await client.chat.completions.create({
    model: 'tern', tools,
    messages: [...messages, { role: 'assistant', content: null, tool_calls: m.tool_calls },
      { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '# tern' },
      { role: 'tool', tool_call_id: m.tool_calls[1].id, content: [{ type: 'text', text: 'README.md src' }] }],
    tern_forced_output: 'It says tern.', max_tokens: 50,
  });
  assert.equal(next.choices[0].message.content, 'It says tern.');
  assert.equal(next.choices[0].finish_reason, 'stop');
});

test('reasoning_content, streamed and not', async () => {
  const forced = '<think>\nThe user greets me.\n</think>\n\nHello!';
  const r = await client.chat.completions.create({ model: 'tern', messages: msgs, max_tokens: 100, tern_forced_output: forced });
  assert.equal(r.choices[0].message.reasoning_content, 'The user greets me.');
  assert.equal(r.choices[0].message.content, 'Hello!');
  const stream = await client.chat.completions.create({ model: 'tern', messages: msgs, max_tokens: 100, stream: true,
    tern_forced_output: forced });
  let reasoning = '', content = '';
  for await (const c of stream) {
    reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
    content += c.choices[0]?.delta?.content ?? '';
  }
  assert.equal(reasoning, 'The user greets me.');
  assert.equal(content, 'Hello!');
  // reasoning sent back in the history is accepted
  const back = await client.chat.completions.create({ model: 'tern', max_tokens: 4,
    messages: [...msgs, r.choices[0].message, { role: 'user', content: 'And?' }] });
  assert.equal(back.object, 'chat.completion');
});

test('errors arrive as the SDK error classes', async () => {
  const bad = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: 'x', messages: msgs }), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError, e.constructor.name);
    assert.equal(e.status, 401);
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: 'x', messages: msgs, n: 3 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, e.constructor.name);
    assert.match(e.message, /n = 1/);
    assert.equal(e.param, 'n');
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: 'x', messages: [{ role: 'oracle', content: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && /oracle/.test(e.message));
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, e.constructor.name);
    return true;
  });
});
