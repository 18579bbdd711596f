// tern serve end to end over HTTP (node's fetch): a generated tiny model, every route,
// SSE framing, streamed == non-streamed, the output parser through the real
// detokenizer (test-only forced output), stop strings, error shapes and codes,
// cancellation on disconnect leaving the engine consistent.
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { makeModel, startServer, tmp, sseFrames, banEnds } from '../clients/harness.mjs';

let srv;
const dir = tmp();

before(async () => {
  const model = makeModel(dir);
  srv = await startServer(['--model', model, '--ctx-size', '1024', '--max-body', '200000', '--queue', '4'],
    { TERN_TEST_FORCED_OUTPUT: '1' });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, 'tern serve exits 0 on SIGTERM');
});

async function post(path, body, headers = {}) {
  const r = await fetch(srv.base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* SSE or error */ }
  return { status: r.status, headers: r.headers, text, json };
}

function assertError(r, status, type, needle) {
  assert.equal(r.status, status, r.text);
  const e = r.json?.error;
  assert.ok(e, `OpenAI error shape: ${r.text}`);
  assert.equal(typeof e.message, 'string');
  assert.equal(e.type, type);
  assert.ok('param' in e && 'code' in e);
  if (needle) assert.match(e.message, needle);
}

const greedy = (content, extra = {}) => ({
  model: 'x', messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content }],
  max_tokens: 12, temperature: 0, ...extra,
});

// The chat content a stream carries, re-assembled.
function assemble(text) {
  const frames = sseFrames(text);
  const out = { content: '', reasoning: '', calls: [], finish: null, usage: null, role: null, tern: null, done: false };
  for (const f of frames) {
    if (f.data === '[DONE]') { out.done = true; continue; }
    if (!f.data) continue;
    assert.equal(out.done, false, 'nothing after [DONE]');
    const c = JSON.parse(f.data);
    if (c.usage) out.usage = c.usage;
    if (c.tern) out.tern = c.tern;
    for (const ch of c.choices) {
      const d = ch.delta;
      if (d.role) out.role = d.role;
      if (d.content) out.content += d.content;
      if (d.reasoning_content) out.reasoning += d.reasoning_content;
      for (const tc of d.tool_calls || []) {
        if (!out.calls[tc.index]) out.calls[tc.index] = { id: tc.id, name: tc.function.name, args: '' };
        out.calls[tc.index].args += tc.function.arguments || '';
      }
      if (ch.finish_reason) out.finish = ch.finish_reason;
    }
  }
  return out;
}

// Prometheus text as scrapers want it: every family has its # HELP and then its # TYPE,
// and every sample belongs to the family whose head came last (families are not split).
function checkExposition(met) {
  const lines = met.split('\n').filter((l) => l);
  let family = null;
  const seen = new Set();
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i];
    if (l.startsWith('# HELP ')) {
      const name = l.split(' ')[2];
      assert.match(lines[i + 1] || '', new RegExp(`^# TYPE ${name} (counter|gauge|summary|histogram)$`), l);
      assert.ok(!seen.has(name), `${name}: one head`);
      assert.ok(l.length > `# HELP ${name} `.length + 3, `${name} has a help text`);
      seen.add(name);
      family = name;
      i++;
      continue;
    }
    assert.ok(!l.startsWith('#'), `a head without # HELP: ${l}`);
    const name = l.split(/[{ ]/)[0];
    assert.ok(family && (name === family || name.replace(/_(sum|count|bucket)$/, '') === family),
      `${name} sampled under ${family}'s head`);
  }
  return seen;
}

test('health, models, metrics', async () => {
  const h = await fetch(srv.base + '/health');
  assert.equal(h.status, 200);
  const m = await (await fetch(srv.base + '/v1/models')).json();
  assert.equal(m.object, 'list');
  assert.equal(typeof m.data[0].id, 'string');
  assert.equal(m.data[0].meta.n_ctx, 1024);
  const met = await (await fetch(srv.base + '/metrics')).text();
  assert.match(met, /^tern_queue_capacity 4$/m);
  assert.match(met, /tern_cache_requests_total\{tier="cold"\}/);
  const families = checkExposition(met);
  assert.ok(families.has('tern_ttft_seconds') && families.has('tern_engine_step_sequences'), 'server and engine lines');
});

test('non-streamed chat: shape, usage, reuse report, greedy determinism', async () => {
  const a = await post('/v1/chat/completions', greedy('Hello there'));
  assert.equal(a.status, 200, a.text);
  const j = a.json;
  assert.equal(j.object, 'chat.completion');
  assert.match(j.id, /^chatcmpl-/);
  const ch = j.choices[0];
  assert.equal(ch.message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(ch.finish_reason));
  assert.ok(j.usage.prompt_tokens > 5);
  assert.ok(j.usage.completion_tokens >= 1 && j.usage.completion_tokens <= 12);
  assert.equal(j.usage.total_tokens, j.usage.prompt_tokens + j.usage.completion_tokens);
  assert.ok(j.usage.prompt_tokens_details.cached_tokens <= j.usage.prompt_tokens);
  assert.equal(typeof j.tern.reuse.tier, 'string');
  assert.equal(j.tern.reuse.cached + j.tern.reuse.read, j.usage.prompt_tokens);
  const b = await post('/v1/chat/completions', greedy('Hello there'));
  assert.deepEqual(b.json.choices[0].message, ch.message, 'greedy output repeats');
});

test('streamed chat equals non-streamed; framing; usage chunk', async () => {
  const plain = await post('/v1/chat/completions', greedy('Tell me a story'));
  const r = await post('/v1/chat/completions', greedy('Tell me a story',
    { stream: true, stream_options: { include_usage: true } }));
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  assert.ok(r.text.endsWith('data: [DONE]\n\n'));
  const s = assemble(r.text);
  assert.equal(s.role, 'assistant');
  const m = plain.json.choices[0].message;
  assert.equal(s.content, m.content ?? '');
  assert.equal(s.reasoning, m.reasoning_content ?? '');
  assert.equal(s.finish, plain.json.choices[0].finish_reason);
  assert.deepEqual(s.usage.completion_tokens, plain.json.usage.completion_tokens);
  const frames = sseFrames(r.text).filter((f) => f.data && f.data !== '[DONE]').map((f) => JSON.parse(f.data));
  const last = frames[frames.length - 1];
  assert.deepEqual(last.choices, [], 'the usage chunk has choices: []');
  assert.ok(last.tern.reuse, 'the final chunk carries the reuse report');
  // without include_usage there is no usage chunk
  const r2 = assemble((await post('/v1/chat/completions', greedy('Hi', { stream: true }))).text);
  assert.equal(r2.usage, null);
  assert.ok(r2.done);
});

test('reasoning and tool calls through the real detokenizer (forced output)', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } },
    { type: 'function', function: { name: 'now' } }];
  const forced = '<think>\nI should look it up.\n</think>\n\nChecking.\n<tool_call>\n{"name": "get_weather", '
    + '"arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>';
  const a = await post('/v1/chat/completions', greedy('Weather in Paris?', { tools, tern_forced_output: forced, max_tokens: 200 }));
  assert.equal(a.status, 200, a.text);
  const m = a.json.choices[0].message;
  assert.equal(m.reasoning_content, 'I should look it up.');
  assert.equal(m.content, 'Checking.');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris', unit: 'c' });
  assert.match(m.tool_calls[0].id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(a.json.choices[0].finish_reason, 'tool_calls');
  const s = assemble((await post('/v1/chat/completions', greedy('Weather in Paris?',
    { tools, tern_forced_output: forced, max_tokens: 200, stream: true }))).text);
  assert.equal(s.reasoning, 'I should look it up.');
  assert.equal(s.content, 'Checking.');
  assert.equal(s.calls[0].name, 'get_weather');
  assert.equal(s.calls[0].args, m.tool_calls[0].function.arguments);
  assert.equal(s.finish, 'tool_calls');
  // tool_choice none: the markers are plain content
  const n = await post('/v1/chat/completions', greedy('x', { tools, tool_choice: 'none', max_tokens: 100, tern_forced_output: '<tool_call>{"name":"now"}</tool_call>' }));
  assert.equal(n.json.choices[0].message.content, '<tool_call>{"name":"now"}</tool_call>');
  // a truncated answer: finish_reason length
  const l = await post('/v1/chat/completions', greedy('x', { tern_forced_output: 'one two three four five six', max_tokens: 2 }));
  assert.equal(l.json.choices[0].finish_reason, 'length');
  assert.equal(l.json.usage.completion_tokens, 2);
});

test('stop strings never leak, streamed or not', async () => {
  const body = greedy('x', { tern_forced_output: 'alpha beta STOP gamma', stop: ['STOP', 'zzz'], max_tokens: 50 });
  const a = await post('/v1/chat/completions', body);
  assert.equal(a.json.choices[0].message.content, 'alpha beta');
  assert.equal(a.json.choices[0].finish_reason, 'stop');
  const s = assemble((await post('/v1/chat/completions', { ...body, stream: true })).text);
  assert.equal(s.content, 'alpha beta');
  assert.doesNotMatch(s.content, /ST/);
});

test('completions: text and token-id prompts, stream', async () => {
  const a = await post('/v1/completions', { prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.object, 'text_completion');
  assert.equal(typeof a.json.choices[0].text, 'string');
  assert.ok(a.json.usage.completion_tokens <= 5);
  const ids = (await post('/tokenize', { content: 'Once upon a time' })).json.tokens;
  const b = await post('/v1/completions', { prompt: ids, max_tokens: 5, temperature: 0 });
  assert.equal(b.json.choices[0].text, a.json.choices[0].text, 'ids and text prompts agree');
  const s = await post('/v1/completions', { prompt: 'Once upon a time', max_tokens: 5, temperature: 0, stream: true });
  let text = '';
  for (const f of sseFrames(s.text)) if (f.data && f.data !== '[DONE]') text += JSON.parse(f.data).choices[0]?.text ?? '';
  assert.equal(text, a.json.choices[0].text);
  assertError(await post('/v1/completions', { prompt: [99999999] }), 400, 'invalid_request_error', /vocabulary/);
});

test('tokenize / detokenize round trip', async () => {
  const t = await post('/tokenize', { content: 'Hello, wörld! <|im_start|>', with_pieces: false });
  assert.equal(t.status, 200);
  assert.ok(t.json.tokens.length > 3);
  const d = await post('/detokenize', { tokens: t.json.tokens });
  assert.equal(d.json.content, 'Hello, wörld! <|im_start|>');
  assertError(await post('/detokenize', { tokens: ['a'] }), 400, 'invalid_request_error');
  // ids that split a character: the broken bytes become U+FFFD, the rest is kept
  const ch = (await post('/tokenize', { content: '\u0800' })).json.tokens; // E0 A0 80
  assert.ok(ch.length > 1, 'the tiny vocabulary reads U+0800 in pieces');
  const ab = (await post('/tokenize', { content: 'ab' })).json.tokens;
  const cd = (await post('/tokenize', { content: 'cd' })).json.tokens;
  const broken = await post('/detokenize', { tokens: [...ab, ch[0], ...cd] });
  assert.equal(broken.status, 200, broken.text);
  assert.equal(broken.json.content, 'ab\ufffdcd');
});

test('errors: shapes and codes', async () => {
  assertError(await post('/v1/chat/completions', '{"messages": [}'), 400, 'invalid_request_error', /column/);
  assertError(await post('/v1/chat/completions', Buffer.from('{"messages":[{"role":"user","content":"\xff"}]}', 'latin1')),
    400, 'invalid_request_error', /UTF-8/);
  assertError(await post('/v1/chat/completions', { messages: [{ role: 'wizard', content: 'x' }] }), 400,
    'invalid_request_error', /wizard/);
  assertError(await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], n: 2 }), 400,
    'invalid_request_error', /n = 1/);
  const long = 'word '.repeat(3000);
  const r = await post('/v1/chat/completions', { messages: [{ role: 'user', content: long }] });
  assertError(r, 400, 'invalid_request_error', /\d+ tokens; the context holds 1024/);
  assert.equal(r.json.error.code, 'context_length_exceeded');
  assertError(await post('/v1/chat/completions', 'x'.repeat(250000)), 413, 'invalid_request_error', /200000/);
  const nf = await fetch(srv.base + '/v1/nothing');
  assert.equal(nf.status, 404);
  assert.equal((await nf.json()).error.type, 'not_found_error');
  const na = await fetch(srv.base + '/v1/chat/completions');
  assert.equal(na.status, 405);
  assert.equal(na.headers.get('allow'), 'POST');
  // a template error is a 400 too: the ChatML template reads message.content, fine;
  // an unknown role never gets that far. The server survives all of the above:
  assert.equal((await fetch(srv.base + '/health')).status, 200);
});

test('a client that disconnects cancels its request; the engine stays consistent', async () => {
  const before = (await post('/v1/chat/completions', greedy('Consistency check'))).json.choices[0].message;
  // the request must still be running when the client goes (banEnds)
  const bias = await banEnds(srv);
  assert.equal(Object.keys(bias).length, 2);
  const ctl = new AbortController();
  const r = await fetch(srv.base + '/v1/chat/completions', {
    method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'go on forever' }], max_tokens: 100000, stream: true,
      logit_bias: bias }),
  });
  const reader = r.body.getReader();
  await reader.read(); // the stream has started
  ctl.abort();
  let cancelled = false;
  for (let i = 0; i < 100 && !cancelled; i++) {
    const met = await (await fetch(srv.base + '/metrics')).text();
    cancelled = /^tern_requests_cancelled_total [1-9]/m.test(met);
    if (!cancelled) await new Promise((res) => setTimeout(res, 100));
  }
  assert.ok(cancelled, 'the server noticed the disconnect');
  const again = (await post('/v1/chat/completions', greedy('Consistency check'))).json.choices[0].message;
  assert.deepEqual(again, before, 'same greedy answer after a cancelled request');
});

test('api keys: 401 without, 200 with; /health open', async () => {
  const model = makeModel(dir, ['--seed', '7']);
  const s2 = await startServer(['--model', model, '--ctx-size', '256', '--api-key', 'sekret', '--api-key', 'other']);
  try {
    assert.equal((await fetch(s2.base + '/health')).status, 200);
    const no = await fetch(s2.base + '/v1/models');
    assert.equal(no.status, 401);
    assert.equal((await no.json()).error.type, 'authentication_error');
    const bad = await fetch(s2.base + '/v1/models', { headers: { authorization: 'Bearer nope' } });
    assert.equal(bad.status, 401);
    const ok = await fetch(s2.base + '/v1/models', { headers: { authorization: 'Bearer other' } });
    assert.equal(ok.status, 200);
    const chat = await fetch(s2.base + '/v1/chat/completions', {
      method: 'POST', headers: { authorization: 'Bearer other', 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, temperature: 0 }),
    });
    assert.equal(chat.status, 200);
    const met = await (await fetch(s2.base + '/metrics', { headers: { authorization: 'Bearer other' } })).text();
    assert.ok(checkExposition(met).has('tern_cache_tenant_sessions'), 'tenant lines, each family whole');
  } finally {
    assert.equal(await s2.stop(), 0);
  }
});
