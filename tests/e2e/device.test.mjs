// The server with its sessions on a Vulkan device (--device vulkan:0, lavapipe in CI;
// issue 21): a light twin of server-e2e and reuse-e2e on generated tiny qwen3
// (attention-only) and qwen35 (hybrid) models. Every resumed request is compared with a
// server on the same device that reuses nothing: the same greedy output and, with
// TERN_STATE_HASH=1, the same final state hash (resumed equals cold within the backend).
// - multi-turn reuse: the second turn resumes (cached_tokens > 0);
// - the hybrid resumes from a checkpoint when the client rewrote the reply;
// - a restart resumes from the disk tier (--cache-dir): export and import on the device;
// - --cache-vram keeps the hybrid's checkpoints in device memory (counted on /metrics,
//   said at start), and the answer resumed from one equals cold;
// - predictive priming primes on the device in idle time, and the next turn equals cold;
// - concurrent requests share device steps (tern_eval_batch: one step over several
//   sessions' rows), and each answer and state hash equals the same request alone;
// - a client that disconnects cancels its request; the engine stays consistent;
// - a lost device (TERN_TEST_VK_LOSE_AFTER) fails the request with 500, logged;
// - --spec ngram verifies its drafts on the device (a hybrid's state trail there), and
//   --spec mtp drafts with the head on the device; both answer as the cold server does,
//   with the same state;
// - $TERN_DEVICE chooses the device as --device does.
// - --n-cpu-moe 2 and --gpu-layers 2 on a hybrid MoE: said at start and on /metrics, resumed
//   equals cold.
// Skips (77) without a Vulkan device unless TERN_REQUIRE_VULKAN=1.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { banEnds, bin, logged, skip, startServer, stateHash, tmp } from '../clients/harness.mjs';

const devs = spawnSync(bin, ['devices', '--json'], { encoding: 'utf8' });
let info = {};
try { info = JSON.parse(devs.stdout); } catch { /* below */ }
if (!info.vulkan_built || !info.vulkan || info.vulkan.length === 0) {
  const why = `no Vulkan device (${info.vulkan_built === false ? 'built without the Vulkan backend'
    : info.vulkan_error || devs.stderr.trim() || 'none listed'})`;
  if (process.env.TERN_REQUIRE_VULKAN === '1') {
    console.log(`FAIL: ${why}`);
    process.exit(1);
  }
  skip(why);
}

const dir = tmp();
function makeModel(preset) {
  const out = join(dir, `${preset}.gguf`);
  const r = spawnSync(bin, ['mkmodel', '--preset', preset, '--n-layer', '4', '--out', out], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`mkmodel ${preset}: ${r.stderr}`);
  return out;
}
const models = { qwen35: makeModel('tiny-qwen35'), qwen3: makeModel('tiny-qwen3') };
const common = ['--ctx-size', '1024', '--chunk', '32', '--parallel', '2'];
const env = { TERN_STATE_HASH: '1', TERN_PREDICT: '0' };
const offEnv = { ...env, TERN_AFFINITY: '0', TERN_REUSE_POOL: '0' };

const servers = {};
before(async () => {
  for (const [arch, m] of Object.entries(models)) {
    servers[arch] = {
      on: await startServer(['--model', m, '--device', 'vulkan:0', ...common], env),
      // the cold twin takes its device from the environment
      off: await startServer(['--model', m, ...common, '--prompt-cache', '0'], { ...offEnv, TERN_DEVICE: 'vulkan:0' }),
    };
  }
});
after(async () => {
  for (const s of Object.values(servers)) {
    assert.equal(await s.on.stop(), 0);
    assert.equal(await s.off.stop(), 0);
  }
});

async function chat(srv, body) {
  const r = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ temperature: 0, max_tokens: 6, ...body }),
  });
  const json = await r.json();
  assert.equal(r.status, 200, JSON.stringify(json));
  return json;
}

let coldSeq = 0;
// The same body to the reusing server and to the cold one: same output, same state.
async function both(arch, body) {
  const { on, off } = servers[arch];
  const a = await chat(on, body);
  const b = await chat(off, { ...body, session_id: undefined, cache_salt: `cold-${++coldSeq}` });
  assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens, 'same prompt on both servers');
  assert.deepEqual(a.choices[0].message, b.choices[0].message, 'resumed output equals cold output');
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0, 'the cold server reuses nothing');
  assert.equal(await stateHash(on, a.id), await stateHash(off, b.id), 'resumed state equals cold state');
  return a;
}

test('both servers run their sessions on the device', async () => {
  for (const s of Object.values(servers)) {
    await logged(s.on, /sessions on vulkan:0 /);
    await logged(s.off, /sessions on vulkan:0 /);
  }
});

for (const arch of ['qwen3', 'qwen35']) {
  const hybrid = arch === 'qwen35';

  test(`${arch}: the second turn resumes; resumed equals cold`, async () => {
    const key = { session_id: `multi-${arch}` };
    const u1 = { role: 'user', content: 'Name three prime numbers.' };
    const r1 = await both(arch, { ...key, messages: [u1] });
    assert.equal(r1.usage.prompt_tokens_details.cached_tokens, 0);
    const u2 = { role: 'user', content: 'And two more.' };
    const r2 = await both(arch, { ...key, messages: [u1, r1.choices[0].message, u2] });
    const cached = r2.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached > 0 && cached < r2.usage.prompt_tokens, `cached ${cached} of ${r2.usage.prompt_tokens}`);
  });

  test(`${arch}: a rewritten reply resumes ${hybrid ? 'from a checkpoint' : 'by rewinding'}; resumed equals cold`, async () => {
    const key = { session_id: `rewrite-${arch}` };
    const u1 = { role: 'user', content: 'Write a haiku about rivers.' };
    const r1 = await both(arch, { ...key, messages: [u1] });
    // the client sends back a reply other than the one generated
    const r2 = await both(arch, { ...key, messages: [u1, { role: 'assistant', content: 'Water runs downhill.' },
      { role: 'user', content: 'Another one.' }] });
    const cached = r2.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached > 0 && cached <= r1.usage.prompt_tokens, `cached ${cached}, the first prompt ${r1.usage.prompt_tokens}`);
    if (hybrid) assert.equal(r2.tern.reuse.tier, 'checkpoint', JSON.stringify(r2.tern.reuse));
  });
}

async function metric(srv, name) {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\d+)`, 'm'));
  return m ? Number(m[1]) : 0;
}

// Steps so far, and those that held one sequence (the engine's histogram on /metrics).
async function steps(srv) {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  const one = text.match(/^tern_engine_step_sequences_bucket\{le="1"\} (\d+)$/m);
  const all = text.match(/^tern_engine_step_sequences_count (\d+)$/m);
  assert.ok(one && all, 'the step histogram on /metrics');
  return { one: Number(one[1]), all: Number(all[1]) };
}

for (const arch of ['qwen3', 'qwen35']) {
  test(`${arch}: concurrent requests share device steps; each equals its request alone`, async () => {
    const { on, off } = servers[arch];
    const prompts = ['Describe a lighthouse at night.', 'Two plus two is'];
    // Whether the second arrives before the first has finished is up to the machine's
    // load: up to 3 rounds, each checked in full, until a step held both.
    let shared = false;
    for (let round = 0; round < 3 && !shared; round++) {
      const before = await steps(on);
      const bodies = prompts.map((p, i) => ({ messages: [{ role: 'user', content: p }], max_tokens: 12,
        cache_salt: `conc-${arch}-${round}-${i}` }));
      const got = await Promise.all(bodies.map((b) => chat(on, b)));
      const after = await steps(on);
      shared = after.all - before.all > after.one - before.one;
      for (let i = 0; i < bodies.length; i++) {
        const alone = await chat(off, { ...bodies[i], cache_salt: `conc-cold-${arch}-${round}-${i}` });
        assert.deepEqual(got[i].choices[0].message, alone.choices[0].message, 'concurrent output equals alone');
        assert.equal(await stateHash(on, got[i].id), await stateHash(off, alone.id), 'concurrent state equals alone');
      }
    }
    assert.ok(shared, 'a step held both requests');
  });
}

for (const arch of ['qwen3', 'qwen35']) {
  test(`${arch}: a restart resumes from the disk tier; resumed equals cold`, async () => {
    const cacheDir = join(dir, `disk-${arch}`);
    const args = ['--model', models[arch], '--device', 'vulkan:0', ...common, '--cache-dir', cacheDir];
    let srv = await startServer(args, env);
    try {
      const key = { session_id: `disk-${arch}` };
      const u1 = { role: 'user', content: 'Count to three.' };
      const r1 = await chat(srv, { ...key, messages: [u1] });
      for (let i = 0; i < 500 && (await metric(srv, 'tern_cache_disk_writes_total')) < 1; i++)
        await new Promise((r) => setTimeout(r, 20));
      assert.equal(await srv.stop(), 0);
      srv = await startServer(args, env);
      await logged(srv, /disk tier: .*: 1 conversations/);
      const body = { ...key, messages: [u1, r1.choices[0].message, { role: 'user', content: 'Now to five.' }] };
      const a = await chat(srv, body);
      assert.equal(a.tern.reuse.tier, 'disk', JSON.stringify(a.tern.reuse));
      assert.ok(a.usage.prompt_tokens_details.cached_tokens > 0);
      const c = await chat(servers[arch].off, { messages: body.messages, cache_salt: `disk-cold-${arch}` });
      assert.deepEqual(a.choices[0].message, c.choices[0].message, 'resumed output equals cold output');
      assert.equal(await stateHash(srv, a.id), await stateHash(servers[arch].off, c.id), 'resumed state equals cold state');
    } finally {
      assert.equal(await srv.stop(), 0);
    }
  });
}

test('qwen3: a file the device wrote is another layout to a CPU server (resumed equals cold per backend)', async () => {
  const cacheDir = join(dir, 'disk-cross');
  const key = { session_id: 'cross' };
  const u1 = { role: 'user', content: 'Count to three.' };
  let srv = await startServer(['--model', models.qwen3, '--device', 'vulkan:0', ...common, '--cache-dir', cacheDir], env);
  let r1;
  try {
    r1 = await chat(srv, { ...key, messages: [u1] });
    for (let i = 0; i < 500 && (await metric(srv, 'tern_cache_disk_writes_total')) < 1; i++)
      await new Promise((r) => setTimeout(r, 20));
  } finally {
    assert.equal(await srv.stop(), 0);
  }
  srv = await startServer(['--model', models.qwen3, '--device', 'cpu', ...common, '--cache-dir', cacheDir], env);
  try {
    await logged(srv, /another state layout/);
    const a = await chat(srv, { ...key, messages: [u1, r1.choices[0].message, { role: 'user', content: 'Now to five.' }] });
    assert.notEqual(a.tern.reuse.tier, 'disk', 'the device\'s state is not resumed on the CPU');
    assert.equal(await metric(srv, 'tern_cache_disk_invalid_total'), 1);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('qwen35: --cache-vram keeps checkpoints on the device; resumed equals cold', async () => {
  const srv = await startServer(['--model', models.qwen35, '--device', 'vulkan:0', ...common, '--cache-vram', '64'], env);
  const off = servers.qwen35.off;
  const restores = async (from) => {
    const text = await (await fetch(`${srv.base}/metrics`)).text();
    const m = text.match(new RegExp(`^tern_cache_vram_restores_total\\{from="${from}"\\} (\\d+)`, 'm'));
    assert.ok(m, 'tern_cache_vram_restores_total on /metrics');
    return Number(m[1]);
  };
  try {
    await logged(srv, /cache-vram: checkpoints kept in device memory on vulkan:0 .* up to 64 MiB/);
    assert.equal(await metric(srv, 'tern_cache_vram_budget_bytes'), 64 << 20);
    const key = { session_id: 'vram-qwen35' };
    const u1 = { role: 'user', content: 'Write a haiku about snow.' };
    const r1 = await chat(srv, { ...key, messages: [u1] });
    const c1 = await chat(off, { messages: [u1], cache_salt: 'vram-cold-1' });
    assert.deepEqual(r1.choices[0].message, c1.choices[0].message, 'same output as the cold server');
    const n = await metric(srv, 'tern_cache_vram_checkpoints');
    assert.ok(n > 0 && (await metric(srv, 'tern_cache_vram_bytes')) > 0, `${n} checkpoints on the device`);
    // the client rewrote the reply: the turn resumes from a checkpoint kept on the device
    const msgs = [u1, { role: 'assistant', content: 'Snow falls without sound.' }, { role: 'user', content: 'Again.' }];
    const a = await chat(srv, { ...key, messages: msgs });
    assert.equal(a.tern.reuse.tier, 'checkpoint', JSON.stringify(a.tern.reuse));
    assert.ok(a.usage.prompt_tokens_details.cached_tokens > 0);
    assert.ok((await restores('device')) >= 1, 'restored from device memory');
    const c = await chat(off, { messages: msgs, cache_salt: 'vram-cold-2' });
    assert.deepEqual(a.choices[0].message, c.choices[0].message, 'resumed output equals cold output');
    assert.equal(await stateHash(srv, a.id), await stateHash(off, c.id), 'resumed state equals cold state');
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

// Partial offload: a hybrid MoE with two layers' experts on the CPU (--n-cpu-moe 2), or
// the matrices of its last two layers (--gpu-layers 2), said at start and on /metrics; a
// rewritten turn resumes from a checkpoint, equal to a cold server with the same offload
// (output and state hash).
for (const [flag, said, gauge] of [['--n-cpu-moe', /routed experts of 2 of 4 MoE layers in host memory/,
  'tern_device_cpu_moe_layers'], ['--gpu-layers', /weight matrices of 2 of 4 layers in host memory/,
  'tern_device_cpu_layers']]) {
  test(`qwen35moe ${flag} 2: said at start and on /metrics; resumed equals cold`, async () => {
    const moe = makeModel('tiny-qwen35moe');
    const args = ['--model', moe, '--device', 'vulkan:0', flag, '2', ...common];
    const on = await startServer(args, env);
    const off = await startServer([...args, '--prompt-cache', '0'], offEnv);
    try {
      await logged(on, said);
      assert.equal(await metric(on, gauge), 2);
      assert.equal(await metric(on, 'tern_device_moe_layers'), 4);
      const pair = async (body, salt) => {
        const a = await chat(on, body);
        const b = await chat(off, { ...body, session_id: undefined, cache_salt: salt });
        assert.deepEqual(a.choices[0].message, b.choices[0].message, 'resumed output equals cold output');
        assert.equal(await stateHash(on, a.id), await stateHash(off, b.id), 'resumed state equals cold state');
        return a;
      };
      const key = { session_id: `offload${flag}` };
      const u1 = { role: 'user', content: 'Write a haiku about rivers.' };
      await pair({ ...key, messages: [u1] }, `offload${flag}-1`);
      const r2 = await pair({ ...key, messages: [u1, { role: 'assistant', content: 'Water runs downhill.' },
        { role: 'user', content: 'Another one.' }] }, `offload${flag}-2`);
      assert.ok(r2.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(r2.tern.reuse));
    } finally {
      assert.equal(await on.stop(), 0);
      assert.equal(await off.stop(), 0);
    }
  });
}

test('qwen35: predictive priming runs on the device; the next turn equals cold', async () => {
  const srv = await startServer(['--model', models.qwen35, '--device', 'vulkan:0', ...common, '--predict-chunk', '16'],
    { TERN_STATE_HASH: '1' });
  try {
    const key = { session_id: 'predict-qwen35' };
    const u1 = { role: 'user', content: 'List two colours.' };
    const r1 = await chat(srv, { ...key, messages: [u1] });
    let idle = false;
    for (let i = 0; i < 1200 && !idle; i++) {
      idle = (await metric(srv, 'tern_predict_runs_total')) >= 1 && (await metric(srv, 'tern_predict_active')) === 0
        && (await metric(srv, 'tern_engine_busy')) === 0;
      if (!idle) await new Promise((r) => setTimeout(r, 25));
    }
    assert.ok(idle, 'the predictions were primed');
    const msgs = [u1, r1.choices[0].message, { role: 'user', content: 'Two more.' }];
    const a = await chat(srv, { ...key, messages: msgs });
    assert.ok(a.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(a.tern.reuse));
    const c = await chat(servers.qwen35.off, { messages: msgs, cache_salt: 'predict-cold' });
    assert.deepEqual(a.choices[0].message, c.choices[0].message, 'resumed output equals cold output');
    assert.equal(await stateHash(srv, a.id), await stateHash(servers.qwen35.off, c.id), 'resumed state equals cold state');
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

for (const arch of ['qwen3', 'qwen35']) {
  test(`${arch}: --spec ngram on the device answers as without speculation`, async () => {
    // drafts by prompt lookup, verified on the device (a hybrid's state trail kept there)
    const srv = await startServer(['--model', models[arch], '--device', 'vulkan:0', ...common, '--spec', 'ngram',
      '--spec-max', '6'], offEnv);
    try {
      await logged(srv, /sessions on vulkan:0 /);
      const text = 'alpha beta gamma delta alpha beta gamma delta alpha beta gamma delta alpha beta';
      const u1 = { role: 'user', content: `Repeat exactly: ${text}` };
      const bodies = [{ messages: [u1], max_tokens: 40 }, { messages: [u1], max_tokens: 3 }];
      for (const [i, body] of bodies.entries()) {
        const a = await chat(srv, { ...body, cache_salt: `spec-${arch}-${i}` });
        const c = await chat(servers[arch].off, { ...body, cache_salt: `spec-cold-${arch}-${i}` });
        assert.deepEqual(a.choices[0].message, c.choices[0].message, 'the same answer as --spec off');
        assert.deepEqual(a.usage, c.usage, 'the same usage');
        assert.equal(await stateHash(srv, a.id), await stateHash(servers[arch].off, c.id), 'the same state');
      }
      assert.ok((await metric(srv, 'tern_spec_drafted_tokens_total')) > 0, 'drafts were verified on the device');
    } finally {
      assert.equal(await srv.stop(), 0);
    }
  });
}

test('qwen35: --spec mtp drafts with the head on the device; the answers are the plain ones', async () => {
  // an echo MTP head on a tied model that repeats itself: its drafts are accepted
  const m = join(dir, 'echo.gguf');
  const r = spawnSync(bin, ['mkmodel', '--preset', 'tiny-qwen35', '--n-layer', '4', '--mtp', '1', '--mtp-echo', '--tied',
    '--out', m], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const srv = await startServer(['--model', m, '--device', 'vulkan:0', ...common, '--spec', 'mtp', '--spec-max', '4'],
    offEnv);
  const off = await startServer(['--model', m, '--device', 'vulkan:0', ...common, '--spec', 'off'], offEnv);
  try {
    const u1 = { role: 'user', content: 'Repeat exactly: alpha beta gamma delta alpha beta gamma delta' };
    for (const [i, body] of [{ messages: [u1], max_tokens: 32 }, { messages: [u1], max_tokens: 2 }].entries()) {
      const a = await chat(srv, { ...body, cache_salt: `mtp-${i}` });
      const c = await chat(off, { ...body, cache_salt: `mtp-cold-${i}` });
      assert.deepEqual(a.choices[0].message, c.choices[0].message, 'the same answer as --spec off');
      assert.deepEqual(a.usage, c.usage, 'the same usage');
      assert.equal(await stateHash(srv, a.id), await stateHash(off, c.id), 'the same state');
    }
    const drafted = await metric(srv, 'tern_spec_drafted_tokens_total');
    const accepted = await metric(srv, 'tern_spec_accepted_tokens_total');
    assert.ok(drafted > 0 && accepted > 0, `drafted ${drafted}, accepted ${accepted}`);
  } finally {
    assert.equal(await srv.stop(), 0);
    assert.equal(await off.stop(), 0);
  }
});

test('a client that disconnects cancels its request; the engine stays consistent', async () => {
  const srv = servers.qwen35.on;
  const body = { messages: [{ role: 'user', content: 'Consistency check' }] };
  const before = (await chat(srv, body)).choices[0].message;
  const ctl = new AbortController();
  const r = await fetch(srv.base + '/v1/chat/completions', {
    method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'go on forever' }], max_tokens: 100000, stream: true,
      logit_bias: await banEnds(srv) }), // it must still run when the client goes
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
  assert.deepEqual((await chat(srv, body)).choices[0].message, before, 'same greedy answer after a cancelled request');
  await both('qwen35', { session_id: 'after-cancel', messages: [{ role: 'user', content: 'Still exact?' }] });
});

test('a lost device fails the request with 500 and the server logs it', async () => {
  const srv = await startServer(['--model', models.qwen3, '--device', 'vulkan:0', ...common],
    { ...env, TERN_TEST_VK_LOSE_AFTER: '3' });
  try {
    const post = () => fetch(`${srv.base}/v1/chat/completions`, { method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hello' }], max_tokens: 8, temperature: 0 }) });
    const r = await post();
    const j = await r.json();
    assert.equal(r.status, 500, JSON.stringify(j));
    assert.match(j.error.message, /device lost/);
    await logged(srv, /tern error: session: the device failed at position \d+: vulkan: device lost/);
    const r2 = await post(); // and every later one, naming the device
    assert.equal(r2.status, 500);
    assert.match((await r2.json()).error.message, /was lost/);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});
