// Predictive priming end to end (docs/SERVING.md "Predictive priming"), over HTTP on
// generated tiny qwen35 (hybrid), qwen3 (attention-only) and qwen35moe (hybrid MoE) models with a Qwen-style
// template (reasoning rendered only after the last user message), written to a file and
// given with --chat-template. Replies with reasoning and tool calls are forced
// (TERN_TEST_FORCED_OUTPUT=1) through the real parser; the turns that are compared are
// greedy. Every compared turn is checked against a cold server (TERN_PREDICT=0
// TERN_REUSE_POOL=0 --prompt-cache 0): the same output and the same state hash
// (TERN_STATE_HASH=1).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { bin, startServer, tmp } from '../clients/harness.mjs';

const dir = tmp();

const template = [
  "{%- set ns = namespace(last_user=-1) -%}",
  "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}",
  "{%- if tools -%}{{- '<|im_start|>system\\n' + messages[0].content + '\\n# Tools\\n' -}}",
  "{%- for t in tools -%}{{- t | tojson + '\\n' -}}{%- endfor -%}{{- '<|im_end|>\\n' -}}{%- endif -%}",
  "{%- for m in messages -%}",
  "{%- if m.role == 'system' -%}{%- if not tools -%}{{- '<|im_start|>system\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}",
  "{%- elif m.role == 'assistant' -%}",
  "{{- '<|im_start|>assistant\\n' -}}",
  "{%- if loop.index0 > ns.last_user and m.reasoning_content -%}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' -}}{%- endif -%}",
  "{{- m.content -}}",
  "{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}",
  "{{- '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson) + '}\\n</tool_call>' -}}",
  "{%- endfor -%}{%- endif -%}",
  "{{- '<|im_end|>\\n' -}}",
  "{%- elif m.role == 'tool' -%}",
  "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}",
  "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}",
  "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}",
  "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}",
  "{%- endif -%}",
  "{%- endfor -%}",
  "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
].join('');
const tmplPath = join(dir, 'qwen-style.jinja');
writeFileSync(tmplPath, template);

const tools = [{ type: 'function', function: { name: 'read', description: 'read a file',
  parameters: { type: 'object', properties: { path: { type: 'string' } } } } }];

function makeModel(preset) {
  const out = join(dir, `${preset}.gguf`);
  const r = spawnSync(bin, ['mkmodel', '--preset', preset, '--n-layer', '4', '--out', out], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`tern mkmodel failed: ${r.stderr}`);
  return out;
}

const servers = [];
after(async () => {
  for (const s of servers) assert.equal(await s.stop(), 0, 'tern serve exits 0 on SIGTERM');
});

async function serve(model, args = [], env = {}) {
  const s = await startServer(['--model', model, '--chat-template', tmplPath, '--ctx-size', '4096', '--chunk', '64',
    ...args], { TERN_TEST_FORCED_OUTPUT: '1', TERN_STATE_HASH: '1', ...env });
  servers.push(s);
  return s;
}
const coldServer = (model) => serve(model, ['--prompt-cache', '0'], { TERN_PREDICT: '0', TERN_REUSE_POOL: '0' });

async function chat(srv, messages, { forced, session, salt, maxTokens = 6 } = {}) {
  const body = { model: 'x', messages, tools, temperature: 0, max_tokens: forced ? 400 : maxTokens };
  if (forced) body.tern_forced_output = forced;
  if (session) body.session_id = session;
  if (salt) body.cache_salt = salt;
  const r = await fetch(srv.base + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const j = await r.json();
  assert.equal(r.status, 200, JSON.stringify(j));
  return j;
}

async function metrics(srv) {
  const text = await (await fetch(srv.base + '/metrics')).text();
  const m = {};
  for (const line of text.split('\n')) {
    const k = line.match(/^([a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$/);
    if (k) m[k[1]] = Number(k[2]);
  }
  return m;
}

// Until the server has primed what it predicted (the idle work is done).
async function settle(srv) {
  for (let i = 0; i < 1200; i++) {
    const m = await metrics(srv);
    if (m.tern_predict_active === 0 && m.tern_engine_busy === 0) return m;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('the predictions did not finish');
}

async function ntok(srv, text) {
  const r = await fetch(srv.base + '/tokenize', { method: 'POST', body: JSON.stringify({ content: text }) });
  return (await r.json()).tokens.length;
}

// The final state hash the server logged for a request.
async function stateHash(srv, id) {
  for (let i = 0; i < 100; i++) {
    const m = srv.log().match(new RegExp(`state-hash ${id} n_past=(\\d+) total=([0-9a-f]+)`));
    if (m) return `${m[1]}:${m[2]}`;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`no state hash for ${id}`);
}

// A request served by srv equals the same request served cold (a fresh tenant on a
// server that keeps nothing else: nothing to resume from).
let nCold = 0;
async function assertEqualsCold(srv, res, cold, messages, opts = {}) {
  const c = await chat(cold, messages, { ...opts, salt: `cold-${++nCold}` });
  assert.equal(c.tern.reuse.tier, 'cold');
  assert.equal(res.usage.prompt_tokens, c.usage.prompt_tokens);
  assert.deepEqual(res.choices[0].message, c.choices[0].message);
  assert.equal(await stateHash(srv, res.id), await stateHash(cold, c.id));
}

const toolCall = (path) =>
  `<think>\nI should read ${path}.\n</think>\n\n<tool_call>\n{"name": "read", "arguments": {"path": "${path}"}}\n</tool_call>`;
const answer = (text) => `<think>\nThat is enough.\n</think>\n\n${text}`;

for (const preset of ['tiny-qwen35', 'tiny-qwen3', 'tiny-qwen35moe']) describe(preset, () => {
  let model, srvP, cold;
  before(async () => {
    model = makeModel(preset);
    srvP = await serve(model, ['--predict-chunk', '16']);
    cold = await coldServer(model);
  });

  test(`${preset}: a rewrite turn after idle time resumes beyond the rewritten turns, equal to cold`, async () => {
    const s = `rewrite-${preset}`;
    const msgs = [{ role: 'system', content: 'You are a coding agent.' }, { role: 'user', content: 'What does main.c do?' }];
    const r1 = await chat(srvP, msgs, { forced: toolCall('main.c'), session: s });
    assert.equal(r1.choices[0].finish_reason, 'tool_calls');
    await settle(srvP);
    // the client runs the tool and sends the reply back as it got it
    msgs.push(r1.choices[0].message,
      { role: 'tool', tool_call_id: r1.choices[0].message.tool_calls[0].id, content: 'int main(void) { return run(); }' });
    const r2 = await chat(srvP, msgs, { forced: answer('It calls run().'), session: s });
    // the tool-result variant was predicted: the reply as the template renders it is cached
    assert.equal(r2.tern.reuse.tier, 'predicted');
    assert.ok(r2.usage.prompt_tokens_details.cached_tokens > r1.usage.prompt_tokens);
    await settle(srvP);
    // a new user message: the template drops the reasoning of both earlier replies, so
    // the prompt diverges from r2's inside the first reply, and only the new turn is read
    msgs.push(r2.choices[0].message);
    const user = 'And what does run() do?';
    msgs.push({ role: 'user', content: user });
    const r3 = await chat(srvP, msgs, { session: s });
    assert.equal(r3.tern.reuse.tier, 'predicted');
    const tail = await ntok(srvP, `<|im_start|>user\n${user}<|im_end|>\n<|im_start|>assistant\n`);
    assert.equal(r3.usage.prompt_tokens_details.cached_tokens, r3.usage.prompt_tokens - tail);
    // r3's prompt parts from r2's where the first reply begins (r1's prompt end): all
    // that follows it was read ahead
    const rewritten = await ntok(srvP, 'int main(void) { return run(); }It calls run().');
    assert.ok(r3.usage.prompt_tokens_details.cached_tokens > r1.usage.prompt_tokens + rewritten);
    await assertEqualsCold(srvP, r3, cold, msgs, { session: s });
    // the conversation goes on from the predicted state, still equal to cold
    await settle(srvP);
    msgs.push(r3.choices[0].message, { role: 'user', content: 'Thanks.' });
    const r4 = await chat(srvP, msgs, { session: s });
    await assertEqualsCold(srvP, r4, cold, msgs, { session: s });
    const m = await metrics(srvP);
    assert.ok(m.tern_cache_predictions_used_total >= 2);
    assert.ok(m.tern_cache_predict_tokens_total > 0);
    assert.ok(m.tern_predict_seconds_total > 0);
  });

  test(`${preset}: a client that sends back its own record of the reply resumes where its messages ended`, async () => {
    const s = `record-${preset}`;
    const msgs = [{ role: 'system', content: 'You are a coding agent.' }, { role: 'user', content: 'Read util.c.' }];
    const r1 = await chat(srvP, msgs, { forced: toolCall('util.c'), session: s });
    msgs.push(r1.choices[0].message,
      { role: 'tool', tool_call_id: r1.choices[0].message.tool_calls[0].id, content: 'int util(void);' });
    await settle(srvP);
    await chat(srvP, msgs, { forced: answer('It declares util().'), session: s });
    await settle(srvP);
    // a replaying client: its own record of the reply, not what was generated
    const own = 'util.c declares one function.';
    msgs.push({ role: 'assistant', content: own }, { role: 'user', content: 'Fine.' });
    const r3 = await chat(srvP, msgs, { session: s });
    assert.equal(r3.tern.reuse.tier, 'predicted');
    const tail = await ntok(srvP, `<|im_start|>assistant\n${own}<|im_end|>\n<|im_start|>user\nFine.<|im_end|>\n<|im_start|>assistant\n`);
    // at the checkpoint where the client's messages ended (an attention-only model may
    // resume a few tokens further: the turn header matches too)
    const cached = r3.usage.prompt_tokens_details.cached_tokens;
    if (preset.startsWith('tiny-qwen35')) assert.equal(cached, r3.usage.prompt_tokens - tail);
    else assert.ok(cached >= r3.usage.prompt_tokens - tail &&
      cached <= r3.usage.prompt_tokens - tail + (await ntok(srvP, '<|im_start|>assistant\n')),
      `cached ${cached}, prompt ${r3.usage.prompt_tokens}, tail ${tail}, ${JSON.stringify(r3.tern.reuse)}`);
    assert.ok(cached > r1.usage.prompt_tokens + (await ntok(srvP, 'int util(void);')));
    await assertEqualsCold(srvP, r3, cold, msgs, { session: s });
  });

  test(`${preset}: a wrong prediction is never used; memory stays within --cache-ram`, async () => {
    const budget = 3; // MiB: a few tiny sessions, so that eviction happens
    const srv = await serve(model, ['--cache-ram', String(budget), '--predict-chunk', '16']);
    const before = await metrics(srv);
    let used = 0;
    for (let k = 0; k < 4; k++) {
      const s = `wrong-${preset}-${k}`;
      const msgs = [{ role: 'system', content: `Agent ${k}.` }, { role: 'user', content: `Look at file${k}.c.` }];
      const r1 = await chat(srv, msgs, { forced: toolCall(`file${k}.c`), session: s });
      await settle(srv);
      // the tool-result prediction is wrong: the client answers with a user message
      msgs.push(r1.choices[0].message, { role: 'user', content: 'No, do not read it.' });
      const r2 = await chat(srv, msgs, { session: s });
      await assertEqualsCold(srv, r2, cold, msgs, { session: s });
      let m = await metrics(srv);
      assert.ok(m.tern_cache_pool_bytes <= budget * 1048576, `pool ${m.tern_cache_pool_bytes} bytes`);
      used = m.tern_cache_predictions_used_total - before.tern_cache_predictions_used_total;
      assert.ok(m.tern_cache_predictions_wasted_total > before.tern_cache_predictions_wasted_total + k,
        'the tool-result prediction was dropped unused');
      // a history the server never saw (edited system prompt): nothing predicted is used
      const edited = [{ role: 'system', content: `Agent ${k}, edited.` }, ...msgs.slice(1)];
      const r3 = await chat(srv, edited, { session: s });
      assert.notEqual(r3.tern.reuse.tier, 'predicted');
      await assertEqualsCold(srv, r3, cold, edited, { session: s });
      m = await settle(srv);
      assert.equal(m.tern_cache_predictions_used_total - before.tern_cache_predictions_used_total, used);
      assert.ok(m.tern_cache_pool_bytes <= budget * 1048576, `pool ${m.tern_cache_pool_bytes} bytes`);
    }
    assert.ok(used >= 1 && used <= 4, `${used} predictions used`);
  });

  test(`${preset}: a request that arrives mid-prediction is served at once and correctly`, async () => {
    // a pause after every 8-token chunk makes sure the prediction is still running
    const srv = await serve(model, ['--predict-chunk', '8'], { TERN_TEST_PREDICT_DELAY_MS: '250' });
    const s = `mid-${preset}`;
    const msgs = [{ role: 'system', content: 'You are a coding agent.' }, { role: 'user', content: 'What does io.c do?' }];
    const r1 = await chat(srv, msgs, { forced: toolCall('io.c'), session: s });
    // a long tool result, so that priming the prediction takes a while
    const body = Array.from({ length: 12 }, (_, i) => `    write(1, "line ${i}", 6);`).join('\n');
    msgs.push(r1.choices[0].message,
      { role: 'tool', tool_call_id: r1.choices[0].message.tool_calls[0].id, content: `void io(void) {\n${body}\n}` });
    await settle(srv);
    const r2 = await chat(srv, msgs, { forced: answer('It writes one byte.'), session: s });
    msgs.push(r2.choices[0].message, { role: 'user', content: 'Why one byte?' });
    // the prediction of this rewrite is now being primed, 8 tokens every 250 ms
    for (let i = 0; i < 200 && !(await metrics(srv)).tern_predict_active; i++) await new Promise((r) => setTimeout(r, 10));
    await new Promise((r) => setTimeout(r, 400));
    const t0 = performance.now();
    const r3 = await chat(srv, msgs, { session: s });
    const dt = performance.now() - t0;
    const m = await metrics(srv);
    assert.ok(m.tern_predict_preempted_total >= 1, 'the prediction was pre-empted');
    assert.equal(m.tern_preempt_wait_seconds_count, 1);
    console.log(`# ${preset}: request mid-prediction: ${dt.toFixed(0)} ms end to end, waited ` +
      `${(m.tern_preempt_wait_seconds_sum * 1000).toFixed(1)} ms for the pre-emption (a chunk is 8 tokens)`);
    await assertEqualsCold(srv, r3, cold, msgs, { session: s });
    // the partial prediction and the conversation stay consistent
    await settle(srv);
    msgs.push(r3.choices[0].message, { role: 'user', content: 'Ok.' });
    const r4 = await chat(srv, msgs, { session: s });
    await assertEqualsCold(srv, r4, cold, msgs, { session: s });
  });

  test(`${preset}: SIGTERM while a prediction is being primed stops it at once and exits 0`, async () => {
    // a 30 s pause after every chunk: a stop that waited for the priming would take that long
    const srv = await serve(model, ['--predict-chunk', '8'], { TERN_TEST_PREDICT_DELAY_MS: '30000' });
    const s = `sig-${preset}`;
    const msgs = [{ role: 'system', content: 'You are a coding agent.' }, { role: 'user', content: 'What does sig.c do?' }];
    const r1 = await chat(srv, msgs, { forced: toolCall('sig.c'), session: s });
    msgs.push(r1.choices[0].message,
      { role: 'tool', tool_call_id: r1.choices[0].message.tool_calls[0].id, content: 'int sig(void) { return 15; }' });
    let active = false;
    for (let i = 0; i < 400 && !active; i++) {
      active = (await metrics(srv)).tern_predict_active === 1;
      if (!active) await new Promise((r) => setTimeout(r, 10));
    }
    assert.ok(active, 'a prediction is being primed');
    await new Promise((r) => setTimeout(r, 200)); // inside the pause after a chunk
    const t0 = performance.now();
    const code = await srv.stop();
    const took = performance.now() - t0;
    assert.equal(code, 0);
    console.log(`# ${preset}: SIGTERM mid-priming: exited 0 in ${took.toFixed(0)} ms`);
    assert.ok(took < 3000, `exited ${took.toFixed(0)} ms after the signal (the priming's pause is 30 s)`);
    assert.doesNotMatch(srv.log(), /a step is still running after 500 ms/, 'the priming stopped between chunks');
  });

  test(`${preset}: --predict off, --predict user and TERN_PREDICT=0`, async () => {
    for (const [args, env, made] of [[['--predict', 'off'], {}, false], [[], { TERN_PREDICT: '0' }, false],
      [['--predict', 'user'], {}, true]]) {
      const srv = await serve(model, args, env);
      const s = `switch-${preset}`;
      const msgs = [{ role: 'system', content: 'You are a coding agent.' }, { role: 'user', content: 'What does a.c do?' }];
      const r1 = await chat(srv, msgs, { forced: toolCall('a.c'), session: s });
      await settle(srv);
      msgs.push(r1.choices[0].message, { role: 'tool', tool_call_id: r1.choices[0].message.tool_calls[0].id, content: 'int a;' });
      const r2 = await chat(srv, msgs, { forced: answer('It defines a.'), session: s });
      assert.notEqual(r2.tern.reuse.tier, 'predicted', 'no tool-result prediction');
      await settle(srv);
      msgs.push(r2.choices[0].message, { role: 'user', content: 'Ok?' });
      const r3 = await chat(srv, msgs, { session: s });
      const m = await metrics(srv);
      if (made) {
        assert.equal(r3.tern.reuse.tier, 'predicted');
        assert.ok(m.tern_cache_predictions_made_total > 0);
      } else {
        assert.notEqual(r3.tern.reuse.tier, 'predicted');
        assert.equal(m.tern_cache_predictions_made_total, 0);
        assert.equal(m.tern_predict_runs_total, 0);
      }
      await assertEqualsCold(srv, r3, cold, msgs, { session: s });
      assert.equal(await srv.stop(), 0);
      servers.splice(servers.indexOf(srv), 1);
    }
  });
});
