#!/usr/bin/env node
// TTFT of a conversation whose turns alternate between two replicas sharing one
// --cache-dir, at several think times (the client's pause between an answer and its
// next turn): an agent's tool call takes milliseconds, a person's seconds.
//
//   node bench/replicas.mjs --model FILE [--bin build/tern] [--turns 12] [--context 1500]
//                           [--turn-words 300] [--think 0,100,2000] [--peer-wait auto]
//
// Per think time: two fresh replicas on a fresh directory, one named conversation of the
// shape coding agents send (a long system prompt, then per turn a message of --turn-words
// words, as a tool's output is; greedy, 16
// generated tokens), turn k on replica k mod 2, predictive priming off. Reports each
// turn's tier, the tokens it resumed and read, its wait for the peer's write and the
// server's TTFT (its request log), and their sum over the extension turns. --peer-wait is
// passed to both replicas (--cache-peer-wait): 1 is the behaviour without waiting for a
// write in flight (a turn that comes early resumes from the turn before). Figures only.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const model = arg('model');
if (!model) {
  console.error('replicas: --model FILE is required');
  process.exit(2);
}
process.env.TERN_BIN = arg('bin', process.env.TERN_BIN || 'build/tern');
const { startServer } = await import('../tests/clients/harness.mjs');
const turns = Number(arg('turns', '12'));
const context = Number(arg('context', '1500'));
const thinks = arg('think', '0,100,2000').split(',').map(Number);
const peerWait = arg('peer-wait', 'auto');
const turnWords = Number(arg('turn-words', '300'));
const root = mkdtempSync(join(tmpdir(), 'tern-replicas-bench-'));
process.on('exit', () => rmSync(root, { recursive: true, force: true }));

const words = 'the parser reads tokens from the lexer and builds a tree of nodes for each expression'.split(' ');
const text = (n, seed) => Array.from({ length: n }, (_, i) => words[(i * 7 + seed) % words.length]).join(' ');
const SYS = { role: 'system', content: `You are a coding agent. ${text(Math.round(context * 0.75), 1)}` };

async function chat(srv, body) {
  const r = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ temperature: 0, max_tokens: 16, ...body }),
  });
  if (r.status !== 200) throw new Error(await r.text());
  return r.json();
}

async function ttft(srv, id) {
  for (let i = 0; i < 300; i++) {
    const m = srv.log().match(new RegExp(`request ${id} .* ttft=([0-9.]+)s`));
    if (m) return Number(m[1]);
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`no request line for ${id}`);
}

for (const think of thinks) {
  const dir = join(root, `think-${think}`);
  const ctx = 4096 + 2 * (context + turns * (turnWords + 60)) * 4; // (a byte-level vocabulary: ~4 tokens a word)
  const args = ['--model', model, '--ctx-size', String(ctx), '--cache-dir', dir, '--cache-peer-wait', peerWait];
  const reps = [await startServer(args, { TERN_PREDICT: '0' }), await startServer(args, { TERN_PREDICT: '0' })];
  let msgs = [SYS];
  const rows = [];
  for (let t = 1; t <= turns; t++) {
    msgs = [...msgs, { role: 'user', content: `Step ${t}: ${text(turnWords, t)}` }];
    const srv = reps[t % 2];
    const a = await chat(srv, { session_id: 'bench', messages: msgs });
    rows.push({ t, srv, a });
    msgs = [...msgs, { role: 'assistant', content: a.choices[0].message.content }];
    if (think) await new Promise((r) => setTimeout(r, think));
  }
  let sum = 0;
  console.log(`think ${think} ms, --cache-peer-wait ${peerWait}:`);
  for (const { t, srv, a } of rows) {
    const s = await ttft(srv, a.id);
    const u = a.tern.reuse;
    if (t > 1) sum += s;
    console.log(`  turn ${String(t).padStart(2)}  ${u.tier.padEnd(10)} cached ${String(u.cached).padStart(5)} read ${String(u.read).padStart(5)}` +
      `  waited ${String(u.waited_ms || 0).padStart(4)} ms  ttft ${s.toFixed(3)} s`);
  }
  console.log(`  sum of TTFT, turns 2-${turns}: ${sum.toFixed(2)} s`);
  for (const r of reps) await r.stop();
}
