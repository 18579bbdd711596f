#!/usr/bin/env node
// What conversation reuse costs per turn, and what a parked conversation weighs.
//
//   node bench/reuse-cost.mjs --model FILE [--bin build/tern] [--context N] [--turns K]
//                             [--convs C] [--threads 2] [--json]
//
// Starts one `tern serve` (predictive priming off, so that nothing runs between turns),
// plays C conversations of the shape coding agents send: a system prompt of about
// --context tokens, a user request, then K turns that each append a tool call and its
// result (extension turns) with a new user message every fourth turn (a rewrite turn
// under the Qwen templates: the reasoning of the turns since the previous user message
// is dropped). Greedy, 4 generated tokens per turn.
//
// Per turn it reads the server's own request log line (ttft, prime = time spent reading
// the prompt's tokens) and decision line (tier, cached, read), and reports the fixed
// overhead = ttft - prime: parsing, rendering, tokenizing, the reuse decision, restoring
// a checkpoint, the first sample. After each conversation it reads /metrics
// (tern_cache_pool_bytes, sessions, checkpoints) and the server's RSS, so the memory a
// parked conversation holds is the difference between consecutive conversations.
// Figures only: nothing here is a pass/fail condition.
import { readFileSync } from 'node:fs';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
if (process.argv.includes('--help')) {
  console.log('usage: node bench/reuse-cost.mjs --model FILE [--bin PATH] [--context N] [--turns K] [--convs C] [--threads N] [--json]');
  process.exit(0);
}
const model = arg('model');
if (!model) {
  console.error('reuse-cost: --model FILE is required');
  process.exit(2);
}
process.env.TERN_BIN = arg('bin', process.env.TERN_BIN || 'build/tern');
// (imported after TERN_BIN is set: the harness reads it when loaded)
const { startServer } = await import('../tests/clients/harness.mjs');
const context = Number(arg('context', '2000'));
const turns = Number(arg('turns', '8'));
const convs = Number(arg('convs', '2'));
const threads = arg('threads', '2');

// Deterministic filler text: roughly one token per word for BPE vocabularies.
function words(n, seed) {
  const base = ['the', 'function', 'returns', 'a', 'value', 'when', 'called', 'with', 'its', 'argument', 'list',
    'parser', 'reads', 'file', 'line', 'buffer', 'error', 'handler', 'module', 'tests', 'pass', 'index', 'cache'];
  let x = seed >>> 0 || 1;
  const out = [];
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    out.push(base[x % base.length]);
  }
  return out.join(' ');
}

const tools = [{
  type: 'function',
  function: { name: 'read_file', description: 'Read a file', parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } },
}];

const srv = await startServer(['--model', model, '--threads', threads, '--predict', 'off'], { TERN_LOG: 'info' });
const rss = () => {
  const m = readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB/m);
  return m ? Number(m[1]) * 1024 : 0;
};
const metric = (text, name) => {
  const m = text.match(new RegExp(`^${name} ([0-9.e+]+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};

async function lineFor(id, re) {
  for (let i = 0; i < 200; i++) {
    const line = srv.log().split('\n').find((l) => l.includes(id) && re.test(l));
    if (line) return line;
    await new Promise((r) => setTimeout(r, 10));
  }
  return '';
}

const rows = [];
const mem = [{ conv: 0, pool: 0, sessions: 0, checkpoints: 0, rss: rss() }];
for (let c = 1; c <= convs; c++) {
  const messages = [
    { role: 'system', content: `You are agent ${c}. ${words(context, c * 7919)}` },
    { role: 'user', content: `Task ${c}: fix the failing test.` },
  ];
  for (let t = 0; t <= turns; t++) {
    const body = { model: 'x', messages, tools, max_tokens: 4, temperature: 0, stream: false };
    const t0 = performance.now();
    const r = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    const j = await r.json();
    const client_s = (performance.now() - t0) / 1000;
    if (r.status !== 200) throw new Error(`turn ${t}: ${r.status} ${JSON.stringify(j)}`);
    const line = await lineFor(j.id, /ttft=/);
    const m = line.match(/prompt=(\d+) cached=(\d+) read=(\d+) .*ttft=([0-9.]+)s prime=([0-9.]+)s total=([0-9.]+)s/);
    if (!m) throw new Error(`no request line for ${j.id}`);
    const kind = t === 0 ? 'cold' : t % 4 === 0 ? 'rewrite' : 'extension';
    rows.push({
      conv: c, turn: t, kind, tier: j.tern?.reuse?.tier, prompt: Number(m[1]), cached: Number(m[2]), read: Number(m[3]),
      ttft: Number(m[4]), prime: Number(m[5]), overhead: Number(m[4]) - Number(m[5]), client_s,
    });
    // the next turn: the reply as a tool call (with reasoning) and its result, or a new user message
    const next = t + 1;
    messages.push({
      role: 'assistant', content: '', reasoning_content: `I should look at file ${next}. ${words(40, next * 31 + c)}`,
      tool_calls: [{ id: `call_${c}_${next}`, type: 'function', function: { name: 'read_file', arguments: JSON.stringify({ path: `src/f${next}.c` }) } }],
    });
    messages.push({ role: 'tool', tool_call_id: `call_${c}_${next}`, content: words(120, next * 101 + c) });
    if (next % 4 === 0) messages.push({ role: 'user', content: `Now also check case ${next}.` });
  }
  const met = await (await fetch(`${srv.base}/metrics`)).text();
  mem.push({
    conv: c, pool: metric(met, 'tern_cache_pool_bytes'), sessions: metric(met, 'tern_cache_sessions'),
    checkpoints: metric(met, 'tern_cache_checkpoints'), rss: rss(), prompt: rows[rows.length - 1].prompt,
  });
}
const code = await srv.stop();

const med = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : NaN;
};
const mib = (b) => (b / 1048576).toFixed(2);
if (process.argv.includes('--json')) {
  console.log(JSON.stringify({ model, context, turns, convs, rows, mem, exit: code }));
  process.exit(code === 0 ? 0 : 1);
}
console.log(`model ${model}, system prompt ~${context} words, ${turns + 1} turns x ${convs} conversations, ${threads} threads`);
console.log('conv turn kind       tier        prompt cached  read   ttft_s  prime_s  overhead_ms');
for (const r of rows) {
  console.log(`${String(r.conv).padStart(4)} ${String(r.turn).padStart(4)} ${r.kind.padEnd(10)} ${String(r.tier).padEnd(10)} `
    + `${String(r.prompt).padStart(7)} ${String(r.cached).padStart(6)} ${String(r.read).padStart(5)} `
    + `${r.ttft.toFixed(3).padStart(8)} ${r.prime.toFixed(3).padStart(8)} ${(r.overhead * 1000).toFixed(1).padStart(10)}`);
}
for (const kind of ['cold', 'extension', 'rewrite']) {
  const k = rows.filter((r) => r.kind === kind);
  if (!k.length) continue;
  console.log(`${kind}: median overhead ${(med(k.map((r) => r.overhead)) * 1000).toFixed(1)} ms `
    + `(range ${(Math.min(...k.map((r) => r.overhead)) * 1000).toFixed(1)}-${(Math.max(...k.map((r) => r.overhead)) * 1000).toFixed(1)}), `
    + `median read ${med(k.map((r) => r.read))} tokens, median ttft ${med(k.map((r) => r.ttft)).toFixed(3)} s`);
}
console.log('after conv  prompt  pool_MiB  sessions  checkpoints  rss_MiB');
for (const m of mem) {
  console.log(`${String(m.conv).padStart(10)} ${String(m.prompt ?? '-').padStart(7)} ${mib(m.pool).padStart(9)} `
    + `${String(m.sessions).padStart(9)} ${String(m.checkpoints).padStart(12)} ${mib(m.rss).padStart(8)}`);
}
for (let i = 2; i < mem.length; i++) {
  console.log(`parked conversation ${i}: pool +${mib(mem[i].pool - mem[i - 1].pool)} MiB, rss +${mib(mem[i].rss - mem[i - 1].rss)} MiB`);
}
console.log(`server exit ${code}`);
process.exit(code === 0 ? 0 : 1);
