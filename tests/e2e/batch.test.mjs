// Continuous batching over HTTP (issue 14, DESIGN.md §8): 8 conversations sent at once
// to a server that runs them together (--parallel 8, a small --batch-tokens so that
// prompt chunks and decode rows share steps) each get exactly the answer, usage and
// final state (TERN_STATE_HASH=1) that a server running one request at a time gives —
// greedy and seeded sampling, streamed and not, different prompt and reply lengths,
// requests that join while others decode, and a conversation resumed from its parked
// session while others decode. On a generated hybrid (qwen35) and dense (qwen3) model.
// /metrics shows that steps did hold several requests.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { bin, startServer, tmp, sseFrames, logged, stateHash } from '../clients/harness.mjs';

const dir = tmp();
const sanitized = process.env.TERN_SANITIZED === 'ON' || process.env.TERN_SANITIZED === '1';

function makeModel(preset) {
  const out = join(dir, `${preset}.gguf`);
  const r = spawnSync(bin, ['mkmodel', '--preset', preset, '--n-layer', '4', '--out', out], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`mkmodel ${preset}: ${r.stderr}`);
  return out;
}

const models = { qwen35: makeModel('tiny-qwen35'), qwen3: makeModel('tiny-qwen3') };
const env = { TERN_STATE_HASH: '1', TERN_PREDICT: '0' };
const common = ['--ctx-size', '1024', '--chunk', '64'];

const servers = {};
before(async () => {
  for (const [name, m] of Object.entries(models)) {
    servers[name] = {
      batched: await startServer(['--model', m, ...common, '--parallel', '8', '--batch-tokens', '24'], env),
      solo: await startServer(['--model', m, ...common, '--parallel', '1'], env),
    };
  }
  // speculative decoding's verify chunks as rows of shared steps (hybrid: the state trail)
  const spec = ['--spec', 'ngram', '--spec-max', '4'];
  servers.spec = {
    batched: await startServer(['--model', models.qwen35, ...common, ...spec, '--parallel', '8', '--batch-tokens',
      '24'], env),
    solo: await startServer(['--model', models.qwen35, ...common, ...spec, '--parallel', '1'], env),
  };
  // more constrained requests at once than the engine keeps matchers for (16)
  servers.grammar = {
    batched: await startServer(['--model', models.qwen3, ...common, '--parallel', '20', '--queue', '32', '--batch-tokens', '512'], env),
    solo: servers.qwen3.solo,
  };
});
after(async () => {
  for (const [name, s] of Object.entries(servers)) {
    assert.equal(await s.batched.stop(), 0);
    if (name !== 'grammar') assert.equal(await s.solo.stop(), 0);
  }
});

async function post(srv, body) {
  const r = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  if (!body.stream) return JSON.parse(text);
  const frames = sseFrames(text).filter((f) => f.data && f.data !== '[DONE]').map((f) => JSON.parse(f.data));
  const content = frames.map((f) => f.choices?.[0]?.delta?.content ?? '').join('');
  const finish = frames.map((f) => f.choices?.[0]?.finish_reason).filter(Boolean).pop();
  const usage = frames.find((f) => f.usage)?.usage;
  return { id: frames[0].id, choices: [{ message: { content }, finish_reason: finish }], usage };
}


const words = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi'.split(' ');
const text = (n, k) => Array.from({ length: n }, (_, i) => words[(i * 7 + k) % words.length]).join(' ');

// Eight conversations: prompts of 3..150 words, replies of 12..48 tokens, greedy and
// seeded sampling, four streamed.
const convs = Array.from({ length: 8 }, (_, k) => ({
  messages: [{ role: 'system', content: `You are assistant ${k}.` }, { role: 'user', content: text(3 + k * 21, k) }],
  max_tokens: 12 + ((k * 13) % 37),
  ...(k % 2 ? { temperature: 0.8, seed: 100 + k } : { temperature: 0 }),
  ...(k % 4 >= 2 ? { stream: true, stream_options: { include_usage: true } } : {}),
}));

async function check(name, solo, batched, label) {
  const { solo: S, batched: B } = servers[name];
  for (let k = 0; k < solo.length; k++) {
    assert.deepEqual(batched[k].choices, solo[k].choices, `${label}: conversation ${k}: the same answer`);
    // (what was reused may differ: the solo server resumed earlier conversations' parked
    // prefixes, the batched one ran them side by side; the state after must not)
    const u = (x) => ({ prompt: x.prompt_tokens, completion: x.completion_tokens, total: x.total_tokens });
    assert.deepEqual(u(batched[k].usage), u(solo[k].usage), `${label}: conversation ${k}: the same usage`);
    assert.equal(await stateHash(B, batched[k].id), await stateHash(S, solo[k].id),
      `${label}: conversation ${k}: the same state after the request`);
  }
}

for (const name of ['qwen35', 'qwen3']) {
  test(`${name}: 8 concurrent conversations equal their solo runs`, async () => {
    const { solo: S, batched: B } = servers[name];
    const solo = [];
    for (const c of convs) solo.push(await post(S, c));
    // all eight at once
    const batched = await Promise.all(convs.map((c) => post(B, c)));
    await check(name, solo, batched, 'all at once');
    // four, then four more while the first ones decode
    const first = convs.slice(0, 4).map((c) => post(B, c));
    await new Promise((r) => setTimeout(r, 60));
    const rest = convs.slice(4).map((c) => post(B, c));
    await check(name, solo, await Promise.all([...first, ...rest]), 'joining mid-way');
    const metrics = await (await fetch(`${B.base}/metrics`)).text();
    const one = Number(metrics.match(/^tern_engine_step_sequences_bucket\{le="1"\} (\d+)$/m)[1]);
    const all = Number(metrics.match(/^tern_engine_step_sequences_count (\d+)$/m)[1]);
    assert.ok(all > one, `some steps batched several requests (${one} of ${all} steps held one)`);
    assert.match(metrics, /^tern_engine_parallel 8$/m);
  });

  test(`${name}: a conversation resumed while others decode equals its solo resume`, async () => {
    const { solo: S, batched: B } = servers[name];
    const turn1 = { messages: convs[5].messages, temperature: 0, max_tokens: 16, session_id: `conv-${name}` };
    const a1 = await post(S, turn1), b1 = await post(B, turn1);
    assert.deepEqual(b1.choices, a1.choices);
    const turn2 = { ...turn1, messages: [...turn1.messages, { role: 'assistant', content: a1.choices[0].message.content },
      { role: 'user', content: text(9, 3) }] };
    const a2 = await post(S, turn2);
    // others decoding long replies when the second turn comes
    const others = [0, 2, 4].map((k) => post(B, { ...convs[k], stream: undefined, stream_options: undefined,
      max_tokens: 80 }));
    await new Promise((r) => setTimeout(r, 40));
    const b2 = await post(B, turn2);
    await Promise.all(others);
    assert.deepEqual(b2.choices, a2.choices, 'the same second answer');
    assert.deepEqual(b2.usage, a2.usage, 'the same usage (cached tokens included)');
    assert.ok(b2.usage.prompt_tokens_details.cached_tokens > 0, 'the second turn resumed');
    assert.equal(await stateHash(B, b2.id), await stateHash(S, a2.id), 'the same state');
    // two requests at once that name the same parked session: one resumes it, the other
    // reads cold (never both mutating one state); both answers and states are the solo one
    const turn3 = { ...turn2, messages: [...turn2.messages, { role: 'assistant', content: a2.choices[0].message.content },
      { role: 'user', content: text(5, 1) }] };
    const a3 = await post(S, turn3);
    const [x, y] = await Promise.all([post(B, turn3), post(B, turn3)]);
    for (const r of [x, y]) {
      assert.deepEqual(r.choices, a3.choices, 'the same third answer');
      assert.equal(await stateHash(B, r.id), await stateHash(S, a3.id), 'the same state');
    }
    const cached = [x, y].map((r) => r.usage.prompt_tokens_details.cached_tokens).sort((p, q) => p - q);
    assert.equal(cached[0], 0, 'one of them read cold');
    assert.ok(cached[1] > 0, 'the other resumed the parked session');
  });
}

test('qwen35 with --spec ngram: 8 concurrent conversations (verify chunks batched) equal their solo runs', async () => {
  const { solo: S, batched: B } = servers.spec;
  const solo = [];
  for (const c of convs) solo.push(await post(S, c));
  const batched = await Promise.all(convs.map((c) => post(B, c)));
  await check('spec', solo, batched, 'speculative, all at once');
  const metrics = await (await fetch(`${B.base}/metrics`)).text();
  assert.ok(Number(metrics.match(/^tern_spec_drafted_tokens_total (\d+)$/m)[1]) > 0, 'drafts were verified');
});

test('qwen3: 20 constrained requests at once (more than the 16 kept matchers) all run and equal their solo runs',
  async () => {
    const { solo: S, batched: B } = servers.grammar;
    const grammars = ['root ::= ("alpha" | "beta" | " ")+', 'root ::= [a-z ]+ "."', 'root ::= ("yes" | "no") (" " [0-9])*'];
    const reqs = Array.from({ length: 20 }, (_, k) => ({
      messages: [{ role: 'user', content: text(4 + k, k) }],
      max_tokens: (sanitized ? 4 : 10) + (k % 5), temperature: 0, grammar: grammars[k % grammars.length],
    }));
    const solo = [];
    for (const r of reqs) solo.push(await post(S, r));
    /* Whether the 20 arrive before the first step is up to the machine's load (a busy
     * one may start stepping the first few): up to 4 rounds, each checked in full, until
     * a step has held more than 16 of them. */
    let all = 0, le16 = 0;
    for (let round = 0; round < 4 && all <= le16; round++) {
      const batched = await Promise.all(reqs.map((r) => post(B, r)));
      for (let k = 0; k < reqs.length; k++) {
        assert.deepEqual(batched[k].choices, solo[k].choices, `request ${k}: the same constrained answer`);
        assert.equal(await stateHash(B, batched[k].id), await stateHash(S, solo[k].id), `request ${k}: the same state`);
      }
      const metrics = await (await fetch(`${B.base}/metrics`)).text();
      le16 = Number(metrics.match(/^tern_engine_step_sequences_bucket\{le="16"\} (\d+)$/m)[1]);
      all = Number(metrics.match(/^tern_engine_step_sequences_count (\d+)$/m)[1]);
    }
    assert.ok(all > le16, `some step held more than 16 requests (${all - le16} of ${all} steps)`);
  });
