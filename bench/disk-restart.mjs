#!/usr/bin/env node
// TTFT of turn 6 after a restart (the disk tier) against the same turn without one.
//
//   node bench/disk-restart.mjs --model FILE [--bin build/tern] [--context N] [--threads 2]
//
// Plays one named conversation of the shape coding agents send (a system prompt of
// about --context tokens, then a user message per turn; greedy, 8 generated tokens) on
// three servers, predictive priming off: "ram" keeps running, "disk" (--cache-dir) is
// restarted between turns 5 and 6, "cold" reuses nothing (turn 6 only). Reports each server's turn-6
// line from its own request log (ttft, prime) and decision line (tier, cached, read).
// Figures only: nothing here is a pass/fail condition.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const model = arg('model');
if (!model) {
  console.error('disk-restart: --model FILE is required');
  process.exit(2);
}
process.env.TERN_BIN = arg('bin', process.env.TERN_BIN || 'build/tern');
const { startServer, sseFrames } = await import('../tests/clients/harness.mjs');
const context = Number(arg('context', '2000'));
const threads = arg('threads', '2');
const dir = mkdtempSync(join(tmpdir(), 'tern-disk-bench-'));
process.on('exit', () => rmSync(dir, { recursive: true, force: true }));

const words = 'the parser reads tokens from the lexer and builds a tree of nodes for each expression'.split(' ');
const text = (n, seed) => Array.from({ length: n }, (_, i) => words[(i * 7 + seed) % words.length]).join(' ');
const SYS = { role: 'system', content: `You are a coding agent. ${text(Math.round(context * 0.75), 1)}` };
const common = ['--model', model, '--threads', threads, '--ctx-size', String(context + 4096)];
const env = { TERN_PREDICT: '0' };

// Streamed, so that a long prime (keep-alive comments) never hits the client's header
// timeout; returns the fields the report needs.
async function chat(srv, body) {
  const r = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ temperature: 0, max_tokens: 8, stream: true, stream_options: { include_usage: true }, ...body }),
  });
  if (r.status !== 200) throw new Error(await r.text());
  const out = { id: null, content: '', reuse: null, usage: null };
  for (const f of sseFrames(await r.text())) {
    if (!f.data || f.data === '[DONE]') continue;
    const c = JSON.parse(f.data);
    out.id = out.id || c.id;
    if (c.tern?.reuse) out.reuse = c.tern.reuse;
    if (c.usage) out.usage = c.usage;
    out.content += c.choices?.[0]?.delta?.content || '';
  }
  return out;
}

async function line(srv, id) {
  for (let i = 0; i < 200; i++) {
    const m = srv.log().match(new RegExp(`request ${id} .* ttft=([0-9.]+)s prime=([0-9.]+)s`));
    if (m) return { ttft: Number(m[1]), prime: Number(m[2]) };
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`no request line for ${id}`);
}

const cacheDir = join(dir, 'cache');
const servers = {
  ram: await startServer(common, env),
  disk: await startServer([...common, '--cache-dir', cacheDir], env),
  cold: await startServer([...common, '--prompt-cache', '0'], { ...env, TERN_REUSE_POOL: '0', TERN_AFFINITY: '0' }),
};
process.on('exit', () => { for (const s of Object.values(servers)) if (s.proc.exitCode === null) s.proc.kill('SIGKILL'); });
let msgs = [SYS];
const report = [];
for (let turn = 1; turn <= 6; turn++) {
  msgs = [...msgs, { role: 'user', content: `Turn ${turn}: ${text(60, turn)}` }];
  if (turn === 6) {
    // wait for the write-ahead of turn 5, then restart the disk server
    for (let i = 0; i < 500; i++) {
      const t = await (await fetch(`${servers.disk.base}/metrics`)).text();
      if (Number((t.match(/^tern_cache_disk_writes_total (\d+)/m) || [0, 0])[1]) >= 5) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    await servers.disk.stop();
    const t0 = Date.now();
    servers.disk = await startServer([...common, '--cache-dir', cacheDir], env);
    report.push(`restart of the disk server (load + index rebuild + /health): ${(Date.now() - t0) / 1000} s`);
  }
  let reply;
  for (const [name, srv] of Object.entries(servers)) {
    if (name === 'cold' && turn < 6) continue; // it only shows turn 6 without reuse
    const r = await chat(srv, name === 'cold' ? { messages: msgs, cache_salt: `c${turn}` } : { messages: msgs, session_id: 'bench' });
    reply = reply ?? r.content;
    if (turn === 6) {
      const l = await line(srv, r.id);
      const ru = r.reuse;
      report.push(`turn 6 ${name.padEnd(4)}: ttft ${l.ttft.toFixed(3)} s (prime ${l.prime.toFixed(3)} s), tier=${ru.tier} `
        + `cached=${ru.cached} read=${ru.read} of ${r.usage?.prompt_tokens}`);
    }
  }
  msgs = [...msgs, { role: 'assistant', content: reply }];
}
for (const s of Object.values(servers)) await s.stop();
console.log(report.join('\n'));
