// The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) driven by the
// official @anthropic-ai/sdk, and the OpenAI Responses API (/v1/responses) by the openai
// package's `responses` (third_party/package.json pins both): every block and event
// type, streamed and whole, tool calls forced by tool_choice on a random model (valid by
// construction: the grammar), thinking / reasoning round trips, usage arithmetic,
// errors in each protocol's shape, unknown fields and tool types, prefix stability
// (the same conversation spelled differently renders to the same tokens), identity and
// lanes (a session's side traffic never takes the main conversation's place), and
// resumed == cold state hashes through both doors.
//
// Replies with reasoning and tool calls use the test-only tern_forced_output (a random
// model emits neither by itself): the engine emits exactly those tokens, through the
// real detokenizer, reply parser and each protocol's renderer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { existsSync } from 'node:fs';
import { makeModel, startServer, tmp, requireOpenAI, sourceDir, sseFrames, stateHash, logged } from './harness.mjs';

const require = createRequire(join(sourceDir, 'third_party', 'package.json'));
requireOpenAI();
const { default: OpenAI } = require('openai');
const { default: Anthropic } = require('@anthropic-ai/sdk');

let srv, cold, model, anthropic, openai;
const KEY = 'test-key-1';

before(async () => {
  const dir = tmp();
  model = makeModel(dir);
  const env = { TERN_TEST_FORCED_OUTPUT: '1', TERN_STATE_HASH: '1' };
  const args = ['--model', model, '--ctx-size', '2048', '--api-key', KEY, '--predict', 'off'];
  srv = await startServer(args, env);
  // a server that reuses nothing: the cold twin of resumed requests
  cold = await startServer([...args, '--prompt-cache', '0'], { ...env, TERN_REUSE_POOL: '0' });
  anthropic = new Anthropic({ baseURL: srv.base, apiKey: KEY, maxRetries: 0, timeout: 60000 });
  openai = new OpenAI({ baseURL: srv.base + '/v1', apiKey: KEY, maxRetries: 0, timeout: 60000 });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0);
  if (cold) assert.equal(await cold.stop(), 0);
});

const post = (base, path, body, headers = {}) => fetch(base + path, {
  method: 'POST', body: JSON.stringify(body),
  headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, ...headers },
});

const TOOLS_A = [
  { name: 'Read', description: 'Read a file', input_schema: { type: 'object', properties: { file_path: { type: 'string', maxLength: 40 } }, required: ['file_path'] } },
  { name: 'Bash', description: 'Run a command', input_schema: { type: 'object', properties: { command: { type: 'string', maxLength: 40 }, timeout: { type: 'integer' } }, required: ['command'] } },
];
const FORCED = '<think>\nThe user wants a file.\n</think>\n\nLet me look.<tool_call>\n'
  + '{"name": "Read", "arguments": {"file_path": "README.md"}}\n</tool_call>';

// ---- Messages ------------------------------------------------------------------------

test('messages: whole response, usage in Anthropic\'s meaning, the models list', async () => {
  const r = await anthropic.messages.create({
    model: 'tern', max_tokens: 6, temperature: 0,
    system: [{ type: 'text', text: 'You are terse.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'Say hi.' }],
    context_management: { edits: [] }, // unknown fields: accepted and ignored
  });
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.match(r.id, /^msg_/);
  assert.equal(r.stop_reason, 'max_tokens');
  assert.equal(r.usage.output_tokens, 6);
  assert.ok(r.content.every((b) => ['text', 'thinking'].includes(b.type)), JSON.stringify(r.content));
  const n = await anthropic.messages.countTokens({ model: 'tern', system: 'You are terse.', messages: [{ role: 'user', content: 'Say hi.' }] });
  // input_tokens excludes what came from the cache; together they are the prompt
  assert.equal(r.usage.input_tokens + r.usage.cache_read_input_tokens, n.input_tokens);
  const models = await anthropic.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].type, 'model');
  assert.equal(typeof models.data[0].display_name, 'string');
  assert.ok(!Number.isNaN(Date.parse(models.data[0].created_at)));
});

test('messages: streaming — thinking, text and tool_use blocks, one at a time', async () => {
  const stream = anthropic.messages.stream({
    model: 'tern', max_tokens: 200, tools: TOOLS_A, tern_forced_output: FORCED,
    thinking: { type: 'enabled', budget_tokens: 1024 },
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Open the readme' }] }],
  });
  const events = [];
  stream.on('streamEvent', (e) => events.push(e));
  const m = await stream.finalMessage();
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  assert.equal(m.content[0].thinking, 'The user wants a file.');
  assert.match(m.content[0].signature, /^tern-/);
  assert.equal(m.content[1].text, 'Let me look.');
  assert.equal(m.content[2].name, 'Read');
  assert.deepEqual(m.content[2].input, { file_path: 'README.md' });
  assert.match(m.content[2].id, /^\w+/);
  assert.equal(m.stop_reason, 'tool_use');
  // the event grammar: message_start, (block_start deltas block_stop)*, message_delta, message_stop
  const types = events.map((e) => e.type);
  assert.equal(types[0], 'message_start');
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  let open = -1;
  for (const e of events) {
    if (e.type === 'content_block_start') { assert.equal(open, -1); open = e.index; }
    if (e.type === 'content_block_delta') assert.equal(e.index, open);
    if (e.type === 'content_block_stop') { assert.equal(e.index, open); open = -1; }
  }
  const sig = events.findIndex((e) => e.type === 'content_block_delta' && e.delta.type === 'signature_delta');
  assert.equal(events[sig + 1].type, 'content_block_stop');
  assert.equal(events.at(-2).usage.output_tokens, m.usage.output_tokens);
  // the same reply whole equals the stream's
  const whole = await anthropic.messages.create({
    model: 'tern', max_tokens: 200, tools: TOOLS_A, tern_forced_output: FORCED,
    messages: [{ role: 'user', content: 'Open the readme' }],
  });
  assert.deepEqual(whole.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  assert.deepEqual(whole.content[2].input, { file_path: 'README.md' });
  assert.equal(whole.stop_reason, 'tool_use');
});

test('messages: tool_choice any and tool are enforced by the grammar on a random model', async () => {
  for (const tc of [{ type: 'any' }, { type: 'tool', name: 'Bash' }]) {
    const r = await anthropic.messages.create({
      model: 'tern', max_tokens: 2000, temperature: 0.7, seed: 7, tools: TOOLS_A, tool_choice: tc,
      thinking: { type: 'disabled' },
      messages: [{ role: 'user', content: 'Do something.' }],
    });
    const uses = r.content.filter((b) => b.type === 'tool_use');
    assert.ok(uses.length >= 1, JSON.stringify(r.content));
    assert.equal(r.stop_reason, 'tool_use');
    for (const u of uses) {
      if (tc.name) assert.equal(u.name, tc.name);
      const tool = TOOLS_A.find((t) => t.name === u.name);
      assert.ok(tool, u.name);
      for (const req of tool.input_schema.required) assert.ok(req in u.input, JSON.stringify(u.input));
    }
  }
});

test('messages: stop_sequences give stop_reason stop_sequence', async () => {
  const r = await anthropic.messages.create({
    model: 'tern', max_tokens: 50, stop_sequences: ['XYZ', 'END'], tern_forced_output: 'one two END three',
    messages: [{ role: 'user', content: 'Count.' }],
  });
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, 'END');
  assert.equal(r.content[0].text, 'one two'); // the reply parser trims a section's trailing whitespace
});

test('messages: errors in Anthropic\'s shape; max_tokens beyond the context is a cap', async () => {
  await assert.rejects(anthropic.messages.create({
    model: 'tern', max_tokens: 8,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }],
  }), (e) => e.status === 400 && e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error'
    && /text only/.test(e.error.error.message));
  const long = 'word '.repeat(3000);
  await assert.rejects(anthropic.messages.create({ model: 'tern', max_tokens: 8, messages: [{ role: 'user', content: long }] }),
    (e) => e.status === 400 && /prompt is too long/.test(e.error.error.message));
  // count_tokens still counts a prompt the context cannot hold (that is what it is for)
  const big = await anthropic.messages.countTokens({ model: 'tern', messages: [{ role: 'user', content: long }] });
  assert.ok(big.input_tokens > 2048, JSON.stringify(big));
  const bad = await post(srv.base, '/v1/messages', { model: 'tern', max_tokens: 4, messages: 'hi' });
  assert.equal(bad.status, 400);
  const body = await bad.json();
  assert.equal(body.type, 'error');
  assert.equal(body.error.type, 'invalid_request_error');
  const noauth = await fetch(srv.base + '/v1/messages?beta=true', { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
  assert.equal(noauth.status, 401);
  assert.equal((await noauth.json()).error.type, 'authentication_error');
  // Claude Code sends 128000
  const r = await anthropic.messages.create({ model: 'tern', max_tokens: 128000, tern_forced_output: 'ok',
    messages: [{ role: 'user', content: 'Say ok.' }] });
  assert.equal(r.content[0].text, 'ok');
});

test('messages: the raw stream — every event named by its data\'s type, ?beta=true ignored', async () => {
  const res = await post(srv.base, '/v1/messages?beta=true', {
    model: 'tern', max_tokens: 2, stream: true, tern_forced_output: 'ok',
    messages: [{ role: 'user', content: 'a b c '.repeat(100) }],
  });
  assert.equal(res.status, 200);
  const frames = sseFrames(await res.text());
  assert.equal(frames[0].event, 'message_start');
  for (const f of frames) assert.equal(JSON.parse(f.data).type, f.event);
  assert.equal(frames.at(-1).event, 'message_stop');
});

// The conversation of a Claude Code session: turn 1, side traffic under the same
// session id (a title request with its own system prompt), turn 2 spelled differently
// (string -> blocks, the billing header's cch changed, the thinking sent back).
test('messages: prefix stability, identity and lanes — turn 2 resumes turn 1', async () => {
  const sid = 'b2c4e6f8-0000-4000-8000-000000000001';
  const headers = { 'x-claude-code-session-id': sid, 'anthropic-version': '2023-06-01' };
  const sys = (cch) => [{ type: 'text', text: `x-anthropic-billing-header: cc_version=2.1.0; cch=${cch};` },
    { type: 'text', text: 'You are Claude Code, a coding agent.' }];
  const metadata = { user_id: JSON.stringify({ device_id: 'd', session_id: sid }) };
  const u1 = { role: 'user', content: 'List the files in this directory, please.' };
  const t1 = await (await post(srv.base, '/v1/messages', {
    model: 'tern', max_tokens: 200, system: sys('aaaa1'), metadata, tools: TOOLS_A, messages: [u1],
    tern_forced_output: FORCED,
  }, headers)).json();
  assert.equal(t1.stop_reason, 'tool_use');
  const p1 = t1.usage.input_tokens + t1.usage.cache_read_input_tokens;
  // side traffic: another system prompt under the same session
  for (let i = 0; i < 3; i++) {
    const side = await (await post(srv.base, '/v1/messages', {
      model: 'tern', max_tokens: 4, system: [{ type: 'text', text: `Summarize in a title. ${i}` }], metadata,
      messages: [{ role: 'user', content: 'List the files in this directory, please.' }],
    }, headers)).json();
    assert.equal(side.type, 'message');
  }
  const turn2 = (cch, u1spelling) => ({
    model: 'tern', max_tokens: 4, system: sys(cch), metadata, tools: TOOLS_A,
    messages: [u1spelling, { role: 'assistant', content: t1.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: t1.content[2].id, content: [{ type: 'text', text: 'README.md src/' }] }] }],
  });
  const blocks = { role: 'user', content: [{ type: 'text', text: u1.content, cache_control: { type: 'ephemeral' } }] };
  // the same conversation spelled differently counts the same tokens
  const c1 = await (await post(srv.base, '/v1/messages/count_tokens', turn2('bbbb2', u1), headers)).json();
  const c2 = await (await post(srv.base, '/v1/messages/count_tokens', turn2('cccc3', blocks), headers)).json();
  assert.equal(c1.input_tokens, c2.input_tokens);
  assert.ok(c1.input_tokens > p1);
  const t2 = await (await post(srv.base, '/v1/messages', turn2('dddd4', blocks), headers)).json();
  assert.equal(t2.usage.input_tokens + t2.usage.cache_read_input_tokens, c1.input_tokens);
  assert.ok(t2.usage.cache_read_input_tokens >= 0.8 * p1, JSON.stringify(t2.usage) + ' p1=' + p1);
  const m = await logged(srv, new RegExp(`request ${t2.id} .* cached=(\\d+)`));
  assert.ok(Number(m[1]) >= 0.8 * p1);
});

test('messages: a system message inside messages stays where it stands', async () => {
  const base = { model: 'tern', messages: [{ role: 'user', content: 'one' }, { role: 'assistant', content: 'two' },
    { role: 'system', content: 'Reminder: be brief.' }, { role: 'user', content: 'three' }] };
  const a = await (await post(srv.base, '/v1/messages/count_tokens', base)).json();
  // the chat door renders the same messages to the same number of tokens
  const tok = await (await post(srv.base, '/v1/chat/completions', { ...base, max_tokens: 1, tern_forced_output: 'x' })).json();
  assert.equal(a.input_tokens, tok.usage.prompt_tokens);
});

// Qwen3.5's template refuses a system message after the first turn; clients send them
// there (Claude Code, Codex's developer messages): it is rendered where it stands, as a
// user turn, the same way every time.
test('messages and responses: a late system message under a template that refuses it', async (t) => {
  const shared = process.env.TERN_SHARED_DIR || process.env.TERN_SHARED_DIR_DEFAULT;
  const tpl = shared && join(shared, 'conformance', 'templates', 'templates', 'qwen3.5-4b.jinja');
  if (!tpl || !existsSync(tpl)) {
    if ((process.env.TERN_REQUIRE_SHARED || '0') !== '0') throw new Error(`no ${tpl}`);
    return t.skip('no ../shared (TERN_SHARED_DIR)');
  }
  const s35 = await startServer(['--model', model, '--ctx-size', '2048', '--chat-template', tpl, '--predict', 'off']);
  try {
    const msgs = [{ role: 'user', content: 'one' }, { role: 'assistant', content: 'two' },
      { role: 'system', content: 'Reminder: be brief.' }, { role: 'user', content: 'three' }];
    const a = await (await fetch(s35.base + '/v1/messages/count_tokens', { method: 'POST', body: JSON.stringify({ model: 'tern', system: 'S', messages: msgs }) })).json();
    const asUser = msgs.map((m) => (m.role === 'system' ? { ...m, role: 'user' } : m));
    const b = await (await fetch(s35.base + '/v1/messages/count_tokens', { method: 'POST', body: JSON.stringify({ model: 'tern', system: 'S', messages: asUser }) })).json();
    assert.ok(a.input_tokens > 0);
    assert.equal(a.input_tokens, b.input_tokens);
    const r = await fetch(s35.base + '/v1/responses', { method: 'POST', body: JSON.stringify({ model: 'tern', max_output_tokens: 1,
      input: [{ role: 'user', content: 'one' }, { role: 'developer', content: 'Permissions: none.' }, { role: 'user', content: 'two' }] }) });
    assert.equal(r.status, 200, await r.clone().text());
    assert.match(s35.log(), /refused a system message after the first turn/);
  } finally {
    assert.equal(await s35.stop(), 0);
  }
});

// ---- Responses -----------------------------------------------------------------------

const TOOLS_R = [
  { type: 'function', name: 'shell', description: 'Run a command', parameters: { type: 'object', properties: { command: { type: 'array', items: { type: 'string', maxLength: 24 }, maxItems: 4 } }, required: ['command'] }, strict: false },
  { type: 'custom', name: 'apply_patch', description: 'Apply a patch', format: { type: 'grammar', syntax: 'lark', definition: 'start: /.+/' } },
  { type: 'web_search' }, { type: 'local_shell' }, { type: 'image_generation' }, // skipped, never a 400
];

test('responses: whole response and usage', async () => {
  const r = await openai.responses.create({ model: 'tern', input: 'Say hi.', max_output_tokens: 5, temperature: 0,
    instructions: 'Be terse.', store: false, include: ['reasoning.encrypted_content'], service_tier: 'auto' });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(typeof r.output_text, 'string');
  assert.equal(r.usage.output_tokens, 5);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.ok(r.usage.input_tokens_details.cached_tokens <= r.usage.input_tokens);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  assert.equal(r.instructions, 'Be terse.');
});

test('responses: streaming lifecycle — reasoning, message, function_call, custom_tool_call', async () => {
  const forced = '<think>\nPlan it.\n</think>\n\nRunning.<tool_call>\n{"name": "shell", "arguments": {"command": ["ls"]}}\n</tool_call>\n'
    + '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\\n*** End Patch"}}\n</tool_call>';
  const stream = await openai.responses.create({ model: 'tern', stream: true, tools: TOOLS_R, input: [
    { type: 'message', role: 'developer', content: 'You may run commands.' },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'List files' }] }],
  reasoning: { effort: 'medium', summary: 'auto' }, parallel_tool_calls: true, tern_forced_output: forced });
  const events = [];
  for await (const e of stream) events.push(e);
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  assert.deepEqual(events.slice(0, 2).map((e) => e.type), ['response.created', 'response.in_progress']);
  const done = events.at(-1);
  assert.equal(done.type, 'response.completed');
  const out = done.response.output;
  assert.deepEqual(out.map((o) => o.type), ['reasoning', 'message', 'function_call', 'custom_tool_call']);
  assert.equal(out[0].content[0].text, 'Plan it.');
  assert.ok(Array.isArray(out[0].summary));
  assert.equal(out[1].role, 'assistant');
  assert.equal(out[1].content[0].text, 'Running.');
  assert.equal(out[2].name, 'shell');
  assert.equal(typeof out[2].arguments, 'string');
  assert.deepEqual(JSON.parse(out[2].arguments), { command: ['ls'] });
  assert.equal(out[3].name, 'apply_patch');
  assert.equal(out[3].input, '*** Begin Patch\n*** End Patch');
  // every item: added, then done with the complete item equal to the final output's
  for (let i = 0; i < out.length; i++) {
    const added = events.findIndex((e) => e.type === 'response.output_item.added' && e.output_index === i);
    const fin = events.findIndex((e) => e.type === 'response.output_item.done' && e.output_index === i);
    assert.ok(added >= 0 && fin > added);
    assert.deepEqual(events[fin].item, out[i]);
  }
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, 'Running.');
  const rtext = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
  assert.equal(rtext, 'Plan it.');
  const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  assert.equal(args, out[2].arguments);
  assert.ok(events.some((e) => e.type === 'response.content_part.added'));
  assert.ok(events.some((e) => e.type === 'response.function_call_arguments.done' && e.arguments === out[2].arguments));
  assert.ok(events.some((e) => e.type === 'response.custom_tool_call_input.done' && e.input === out[3].input));
  assert.ok(done.response.usage.output_tokens_details.reasoning_tokens > 0);
});

test('responses: tool_choice required and text.format json_schema, enforced on a random model', async () => {
  const r = await openai.responses.create({ model: 'tern', tools: TOOLS_R.slice(0, 1), tool_choice: 'required',
    input: 'Run something.', max_output_tokens: 2000, temperature: 0.7, seed: 11, reasoning: { effort: 'none' } });
  assert.equal(r.status, 'completed', JSON.stringify(r.output));
  const call = r.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.ok(Array.isArray(JSON.parse(call.arguments).command));
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, n: { type: 'integer' } }, required: ['name', 'n'], additionalProperties: false };
  const j = await openai.responses.create({ model: 'tern', input: 'JSON please', max_output_tokens: 1500, temperature: 0,
    reasoning: { effort: 'minimal' }, text: { format: { type: 'json_schema', name: 'thing', schema, strict: true } } });
  assert.equal(j.status, 'completed', j.output_text);
  const v = JSON.parse(j.output_text);
  assert.equal(typeof v.name, 'string');
  assert.ok(Number.isInteger(v.n));
});

test('responses: errors and refusals never take a Codex session down by surprise', async () => {
  await assert.rejects(openai.responses.create({ model: 'tern', input: 'hi', previous_response_id: 'resp_1' }),
    (e) => e.status === 400 && /stores no responses/.test(e.message));
  await assert.rejects(openai.responses.create({ model: 'tern', input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,AAAA' }] }] }),
    (e) => e.status === 400 && e.error?.param === 'input[0].content[0]');
  const r = await openai.responses.create({ model: 'tern', input: 'hi', max_output_tokens: 2, tools: TOOLS_R.slice(2) });
  assert.equal(r.status, 'incomplete');
});

// A Codex turn sends back the reasoning, the call and its output; the render must be
// the chat door's for the same conversation (reasoning_content on the assistant turn).
test('responses: reasoning round trip renders as the chat door does', async () => {
  const input = [
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'List files' }] },
    { type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: 'Plan it.' }] },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Running.' }] },
    { type: 'function_call', call_id: 'call_1', name: 'shell', arguments: '{"command":["ls"]}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'README.md' },
  ];
  const r = await openai.responses.create({ model: 'tern', input, tools: TOOLS_R.slice(0, 1), max_output_tokens: 1, tern_forced_output: 'x' });
  const c = await (await post(srv.base, '/v1/chat/completions', {
    model: 'tern', max_tokens: 1, tern_forced_output: 'x',
    tools: [{ type: 'function', function: { name: 'shell', description: 'Run a command', parameters: TOOLS_R[0].parameters } }],
    messages: [{ role: 'user', content: 'List files' },
      { role: 'assistant', content: 'Running.', reasoning_content: 'Plan it.', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'shell', arguments: '{"command":["ls"]}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'README.md' }],
  })).json();
  assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
});

// prompt_cache_key nominates; turn 2 resumes; resumed == cold state hash.
test('responses and messages: resumed equals cold, state hash for state hash', async () => {
  const input1 = [{ role: 'user', content: 'Explain the build.' }];
  const t1 = await openai.responses.create({ model: 'tern', input: input1, prompt_cache_key: 'codex-thread-1',
    max_output_tokens: 8, temperature: 0, tern_forced_output: 'The build uses cmake.' });
  const input2 = [...input1, ...t1.output, { role: 'user', content: 'And the tests?' }];
  const body2 = { model: 'tern', input: input2, prompt_cache_key: 'codex-thread-1', max_output_tokens: 6, temperature: 0 };
  const warm = await openai.responses.create(body2);
  assert.ok(warm.usage.input_tokens_details.cached_tokens >= 0.8 * t1.usage.input_tokens, JSON.stringify(warm.usage));
  const coldClient = new OpenAI({ baseURL: cold.base + '/v1', apiKey: KEY, maxRetries: 0 });
  const c = await coldClient.responses.create(body2);
  assert.equal(c.usage.input_tokens_details.cached_tokens, 0);
  assert.equal(c.output_text, warm.output_text);
  assert.equal(await stateHash(cold, c.id), await stateHash(srv, warm.id));

  const m1 = await anthropic.messages.create({ model: 'tern', max_tokens: 8, temperature: 0, metadata: { user_id: 'user_x_account_y_session_s1' },
    messages: [{ role: 'user', content: 'Explain the build.' }], tern_forced_output: 'It uses cmake.' });
  const mb = { model: 'tern', max_tokens: 6, temperature: 0, metadata: { user_id: 'user_x_account_y_session_s1' },
    messages: [{ role: 'user', content: 'Explain the build.' }, { role: 'assistant', content: m1.content }, { role: 'user', content: 'Tests?' }] };
  const mw = await anthropic.messages.create(mb);
  assert.ok(mw.usage.cache_read_input_tokens > 0);
  const mc = await new Anthropic({ baseURL: cold.base, apiKey: KEY, maxRetries: 0 }).messages.create(mb);
  assert.equal(mc.usage.cache_read_input_tokens, 0);
  assert.deepEqual(mc.content, mw.content);
  assert.equal(await stateHash(cold, mc.id), await stateHash(srv, mw.id));
});
