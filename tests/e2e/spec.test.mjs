// Speculative decoding over HTTP (issue 18, docs/spec.md): a server with --spec ngram
// answers exactly what a server with --spec off answers — content, reasoning, tool
// calls, finish reasons, usage, stop strings, streaming — and ends every request in the
// same state (TERN_STATE_HASH=1), on a generated hybrid (qwen35) and attention-only
// (qwen3) model and on the kit's stories260K (a real model, where prompt lookup drafts
// and is accepted). The request line and /metrics report drafted and accepted tokens.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { bin, sourceDir, startServer, tmp, sseFrames, logged, stateHash } from '../clients/harness.mjs';

const dir = tmp();

function makeModel(preset, extra = [], tag = preset) {
  const out = join(dir, `${tag}.gguf`);
  const r = spawnSync(bin, ['mkmodel', '--preset', preset, '--n-layer', '4', ...extra, '--out', out],
    { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`mkmodel ${preset}: ${r.stderr}`);
  return out;
}

const stories = join(process.env.TERN_SHARED_DIR || join(sourceDir, '../shared'), 'models/stories260K.gguf');
const models = { qwen35: makeModel('tiny-qwen35'), qwen3: makeModel('tiny-qwen3'),
  // MTP drafting (--spec mtp): a random MTP block (its drafts are rejected) and an echo
  // block on a tied model that repeats itself (its drafts are accepted)
  qwen35mtp: makeModel('tiny-qwen35', ['--mtp', '1'], 'tiny-qwen35-mtp'),
  qwen35moemtp: makeModel('tiny-qwen35moe', ['--mtp', '1'], 'tiny-qwen35moe-mtp'),
  qwen35echo: makeModel('tiny-qwen35', ['--mtp', '1', '--mtp-echo', '--tied'], 'tiny-qwen35-echo') };
if (existsSync(stories)) models.stories = stories;
const env = { TERN_STATE_HASH: '1', TERN_PREDICT: '0', TERN_TEST_FORCED_OUTPUT: '1' };
const common = ['--ctx-size', '2048', '--chunk', '64'];
const specArgs = (name) => name.endsWith('mtp') || name.endsWith('echo') ? ['--spec', 'mtp', '--spec-max', '4']
  : ['--spec', 'ngram', '--spec-max', '6'];

const servers = {};
before(async () => {
  for (const [name, m] of Object.entries(models)) {
    servers[name] = {
      spec: await startServer(['--model', m, ...common, ...specArgs(name)], env),
      off: await startServer(['--model', m, ...common, '--spec', 'off'], env),
    };
  }
});
after(async () => {
  for (const s of Object.values(servers)) {
    assert.equal(await s.spec.stop(), 0);
    assert.equal(await s.off.stop(), 0);
  }
});

async function post(srv, path, body) {
  const r = await fetch(`${srv.base}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  return body.stream ? text : JSON.parse(text);
}


// The same body to both servers: the same response (ids and times aside) and state.
// tool calls' ids are random per response
const noIds = (x) => JSON.parse(JSON.stringify(x).replace(/"call_[A-Za-z0-9]+"/g, '"call"'));

async function both(name, path, body) {
  const { spec, off } = servers[name];
  const a = await post(spec, path, body), b = await post(off, path, body);
  if (body.stream) {
    const strip = (t) => sseFrames(t).filter((f) => f.data && f.data !== '[DONE]').map((f) => {
      const j = JSON.parse(f.data);
      return { choices: j.choices, usage: j.usage };
    });
    assert.deepEqual(noIds(strip(a)), noIds(strip(b)), 'the same stream');
    const id = (t) => JSON.parse(sseFrames(t).find((f) => f.data && f.data !== '[DONE]').data).id;
    assert.equal(await stateHash(spec, id(a)), await stateHash(off, id(b)), 'the same state after the request');
    return a;
  }
  assert.deepEqual(noIds(a.choices), noIds(b.choices), 'the same answer');
  assert.deepEqual(a.usage, b.usage, 'the same usage');
  assert.equal(await stateHash(spec, a.id), await stateHash(off, b.id), 'the same state after the request');
  return a;
}

const echoMessages = [
  { role: 'system', content: 'Repeat the user text exactly.' },
  { role: 'user', content: 'alpha beta gamma delta alpha beta gamma delta alpha beta gamma delta alpha beta' },
];

for (const name of ['qwen35', 'qwen3', 'qwen35mtp', 'qwen35moemtp', 'qwen35echo']) {
  test(`${name}: chat answers, streams and stops as without speculation`, async () => {
    const r = await both(name, '/v1/chat/completions', { messages: echoMessages, temperature: 0, max_tokens: 40 });
    const text = r.choices[0].message.content ?? '';
    await both(name, '/v1/chat/completions', { messages: echoMessages, temperature: 0, max_tokens: 40, stream: true,
      stream_options: { include_usage: true } });
    // a stop string taken from the middle of the answer
    if (text.length > 12) {
      const stop = text.slice(6, 10);
      const s = await both(name, '/v1/chat/completions', { messages: echoMessages, temperature: 0, max_tokens: 40,
        stop: [stop] });
      assert.equal(s.choices[0].finish_reason, 'stop');
    }
    // max_tokens at every small budget
    for (const n of [1, 2, 3, 7]) {
      const m = await both(name, '/v1/chat/completions', { messages: echoMessages, temperature: 0, max_tokens: n });
      assert.ok(m.usage.completion_tokens <= n);
    }
    // the next turn resumes the speculative session: same answer and state as resuming a plain one
    const next = await both(name, '/v1/chat/completions', { messages: [...echoMessages,
      { role: 'assistant', content: text }, { role: 'user', content: 'again: alpha beta gamma delta' }],
    temperature: 0, max_tokens: 24 });
    // ... and with --spec mtp the MTP head the turn before left, with its rows
    if (name.endsWith('mtp') || name.endsWith('echo')) {
      const line = await logged(servers[name].spec, new RegExp(`spec: ${next.id} resumes the conversation's MTP head \\((\\d+) rows, tier=\\w+\\)`));
      assert.ok(Number(line[1]) > 0, line[0]);
    }
    // forced output (tests) decodes without drafts and parks every forced token (its end is
    // an end-of-generation, never evaluated)
    const forced = await both(name, '/v1/chat/completions', { messages: echoMessages, temperature: 0,
      tern_forced_output: 'alpha beta gamma delta alpha beta' });
    assert.equal(forced.choices[0].message.content, 'alpha beta gamma delta alpha beta');
    const fh = (await stateHash(servers[name].spec, forced.id)).split(' ')[0];
    assert.equal(Number(fh), forced.usage.prompt_tokens + forced.usage.completion_tokens);
    // sampling with a seed: the same tokens run to run on the speculative server
    const body = { messages: echoMessages, temperature: 0.9, seed: 7, max_tokens: 24 };
    const x = await post(servers[name].spec, '/v1/chat/completions', body);
    const y = await post(servers[name].spec, '/v1/chat/completions', body);
    assert.deepEqual(x.choices, y.choices);
    const metrics = await (await fetch(`${servers[name].spec.base}/metrics`)).text();
    console.log(`# ${name}: ${metrics.match(/^tern_spec_(drafted|accepted)_tokens_total \d+$/mg).join(', ')}`);
  });
}

test('stories260K: prompt lookup drafts and is accepted; the output is the plain one', async (t) => {
  if (!servers.stories) return t.skip('the kit has no stories260K.gguf');
  const body = { prompt: 'Once upon a time, there was a little girl named Lily. She loved to play', temperature: 0,
    max_tokens: 120 };
  const r = await both('stories', '/v1/completions', body);
  assert.ok(r.choices[0].text.length > 50);
  await both('stories', '/v1/completions', { ...body, stream: true });
  await both('stories', '/v1/completions', { ...body, stop: [r.choices[0].text.slice(40, 46)] });
  const line = await logged(servers.stories.spec, new RegExp(`request ${r.id} .* drafted=(\\d+) accepted=(\\d+)`));
  assert.ok(Number(line[1]) > 0 && Number(line[2]) > 0, line[0]);
  assert.ok(Number(line[2]) <= Number(line[1]));
  const metrics = await (await fetch(`${servers.stories.spec.base}/metrics`)).text();
  const drafted = Number(metrics.match(/^tern_spec_drafted_tokens_total (\d+)$/m)[1]);
  const accepted = Number(metrics.match(/^tern_spec_accepted_tokens_total (\d+)$/m)[1]);
  assert.ok(drafted >= Number(line[1]) && accepted > 0 && accepted <= drafted);
  const off = await (await fetch(`${servers.stories.off.base}/metrics`)).text();
  assert.match(off, /^tern_spec_drafted_tokens_total 0$/m);
  // drafts stop at max_tokens: at most max_tokens - 1 tokens are evaluated, one per step
  // for the token sampled before the draft
  const short = await both('stories', '/v1/completions', { ...body, max_tokens: 5 });
  const sl = (await logged(servers.stories.spec, new RegExp(`request ${short.id} [^\n]*`)))[0];
  const sd = sl.match(/ drafted=(\d+)/);
  assert.ok(!sd || Number(sd[1]) <= 3, sl);
  // per request: "spec" turns it on on the plain server and off on the speculative one
  const on = await post(servers.stories.off, '/v1/completions', { ...body, spec: 'ngram', spec_max: 3 });
  assert.deepEqual(on.choices, r.choices);
  assert.match((await logged(servers.stories.off, new RegExp(`request ${on.id} [^\n]*`)))[0], / drafted=[1-9]/);
  const plain = await post(servers.stories.spec, '/v1/completions', { ...body, spec: 'off' });
  assert.deepEqual(plain.choices, r.choices);
  assert.doesNotMatch((await logged(servers.stories.spec, new RegExp(`request ${plain.id} [^\n]*`)))[0], /drafted=/);
  // under a grammar the drafts are verified against its masks: the same constrained answer
  const gbody = { ...body, max_tokens: 40, grammar: 'root ::= ("Lily" | " " | "the" | "park" | "play" | "." | "She" | "loved" | "to")+' };
  const g = await both('stories', '/v1/completions', gbody);
  assert.ok(g.choices[0].text.length > 0);
  const gl = await logged(servers.stories.spec, new RegExp(`request ${g.id} .* drafted=(\\d+) accepted=(\\d+)`));
  assert.ok(Number(gl[1]) > 0, gl[0]);
  const bad = await fetch(`${servers.stories.spec.base}/v1/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, spec: 'mtp' }) });
  assert.equal(bad.status, 400);
});

// Tool calls: the Qwen3 template's <tool_call> opens the tools' grammar (lazily, in the
// middle of the reply; the test-only forced prefix stands for a model that chose to call)
// or holds the whole reply (tool_choice "required"); the speculative server verifies its
// drafts under the grammar's masks and answers exactly what the plain one does.
for (const name of ['qwen3', 'qwen35']) {
  test(`${name}: tool calls under the tools' grammar, with drafts, equal the plain server's`, async () => {
    const tools = [{ type: 'function', function: { name: 'read_file', parameters: { type: 'object', properties: {
      path: { type: 'string', maxLength: 24 }, line: { type: 'integer', minimum: 1, maximum: 99 } },
      required: ['path', 'line'], additionalProperties: false } } }];
    const messages = [{ role: 'user', content: 'read_file path src/main.c line 12, then read_file path src/main.c line 13' }];
    const lazy = { messages, tools, temperature: 0, max_tokens: 60, tern_forced_prefix: 'Let me look.\n<tool_call>\n' };
    const a = await both(name, '/v1/chat/completions', lazy);
    await both(name, '/v1/chat/completions', { ...lazy, stream: true, stream_options: { include_usage: true } });
    const req = { messages, tools, tool_choice: 'required', temperature: 0, max_tokens: 60 };
    const b = await both(name, '/v1/chat/completions', req);
    for (const r of [a, b]) {
      const ch = r.choices[0];
      if (ch.finish_reason !== 'tool_calls') continue; // ran out of max_tokens inside the call
      for (const tc of ch.message.tool_calls) {
        assert.equal(tc.function.name, 'read_file');
        const args = JSON.parse(tc.function.arguments);
        assert.deepEqual(Object.keys(args).sort(), ['line', 'path']);
      }
    }
    const la = await logged(servers[name].spec, new RegExp(`request ${a.id} .* drafted=(\\d+) accepted=(\\d+)`));
    const lb = await logged(servers[name].spec, new RegExp(`request ${b.id} .* drafted=(\\d+) accepted=(\\d+)`));
    assert.ok(Number(la[1]) > 0 && Number(lb[1]) > 0, `${la[0]}\n${lb[0]}`);
    console.log(`# ${name}: lazy call ${la[0].match(/drafted=\d+ accepted=\d+/)}, required ${lb[0].match(/drafted=\d+ accepted=\d+/)}`);
    // sampling under the grammar: valid calls, the same run to run
    const samp = { ...req, temperature: 1, top_k: 0, top_p: 1, min_p: 0, seed: 3 };
    const x = await post(servers[name].spec, '/v1/chat/completions', samp);
    const y = await post(servers[name].spec, '/v1/chat/completions', samp);
    assert.deepEqual(noIds(x.choices), noIds(y.choices));
  });
}

// The head is kept with its conversation in the disk tier's file: after a restart the
// next turn drafts from the head it left (its rows below the resume point), exactly as
// the server that kept it in RAM drafts (the same drafted and accepted counts), and the
// answer is the plain server's.
test('--spec mtp: the MTP head comes back from the disk tier after a restart', async () => {
  const cacheDir = join(dir, 'mtp-disk');
  const args = ['--model', models.qwen35echo, ...common, ...specArgs('qwen35echo'), '--cache-dir', cacheDir];
  let srv = await startServer(args, env);
  const ram = servers.qwen35echo.spec, off = servers.qwen35echo.off;
  const turn1 = { session_id: 'mtp-disk', messages: echoMessages, temperature: 0, max_tokens: 24 };
  const a1 = await post(srv, '/v1/chat/completions', turn1);
  const r1 = await post(ram, '/v1/chat/completions', { ...turn1, session_id: 'mtp-ram' });
  assert.deepEqual(a1.choices, r1.choices);
  for (let i = 0; i < 500 && !/^tern_cache_disk_writes_total [1-9]/m.test(await (await fetch(`${srv.base}/metrics`)).text()); i++)
    await new Promise((r) => setTimeout(r, 20));
  assert.equal(await srv.stop(), 0);
  srv = await startServer(args, env);
  const turn2 = { ...turn1, messages: [...echoMessages, { role: 'assistant', content: a1.choices[0].message.content },
    { role: 'user', content: 'again: alpha beta gamma delta alpha beta gamma delta' }] };
  const a2 = await post(srv, '/v1/chat/completions', turn2);
  const r2 = await post(ram, '/v1/chat/completions', { ...turn2, session_id: 'mtp-ram' });
  const o2 = await post(off, '/v1/chat/completions', turn2);
  assert.equal(a2.tern.reuse.tier, 'disk', JSON.stringify(a2.tern.reuse));
  assert.deepEqual(a2.choices, o2.choices, 'the answer is the plain server\'s');
  const rows = await logged(srv, new RegExp(`spec: ${a2.id} resumes the conversation's MTP head \\((\\d+) rows, tier=disk\\)`));
  assert.ok(Number(rows[1]) > 0, rows[0]);
  const stats = async (s, id) => (await logged(s, new RegExp(`request ${id} .* drafted=(\\d+) accepted=(\\d+)`))).slice(1);
  assert.deepEqual(await stats(srv, a2.id), await stats(ram, r2.id), 'drafts as from the head kept in RAM');
  assert.equal(await srv.stop(), 0);
});

test('--spec mtp: drafts are verified like any others; a model without the head is refused', async () => {
  for (const name of ['qwen35mtp', 'qwen35echo']) {
    const r = await both(name, '/v1/chat/completions', { messages: echoMessages, temperature: 0, max_tokens: 32 });
    const line = await logged(servers[name].spec, new RegExp(`request ${r.id} .* drafted=(\\d+) accepted=(\\d+)`));
    assert.ok(Number(line[1]) > 0, line[0]);
    assert.ok(Number(line[2]) <= Number(line[1]), line[0]);
    // the echo head guesses the token it is given; the tied model repeats itself
    if (name === 'qwen35echo') assert.ok(Number(line[2]) > 0, line[0]);
    // per request: "spec": "mtp" on the plain server of the same model
    const on = await post(servers[name].off, '/v1/chat/completions', { messages: echoMessages, temperature: 0,
      max_tokens: 32, spec: 'mtp', spec_max: 2 });
    assert.deepEqual(on.choices, r.choices);
    assert.match((await logged(servers[name].off, new RegExp(`request ${on.id} [^\n]*`)))[0], / drafted=[1-9]/);
  }
  // the server feeds the prompt's rows to the head: with max_tokens 3 the first token's
  // round may draft one (without the prompt's rows the head could guess only from the
  // second token on, whose round may draft none)
  const s3 = await both('qwen35mtp', '/v1/chat/completions', { messages: echoMessages, temperature: 0, max_tokens: 3 });
  if (s3.usage.completion_tokens === 3)
    assert.match((await logged(servers.qwen35mtp.spec, new RegExp(`request ${s3.id} [^\n]*`)))[0], / drafted=1 /);
  // "spec": "mtp" where the model has no head: a 400 naming why
  const bad = await fetch(`${servers.qwen35.off.base}/v1/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: echoMessages, max_tokens: 4, spec: 'mtp' }) });
  assert.equal(bad.status, 400);
  assert.match(await bad.text(), /multi-token-prediction/);
  // the server itself refuses --spec mtp on such a model
  const r = spawnSync(bin, ['serve', '--model', models.qwen3, '--port', '0', '--spec', 'mtp'],
    { encoding: 'utf8', timeout: 20000 });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--spec mtp: the model \(qwen3\) has no multi-token-prediction head/);
});
