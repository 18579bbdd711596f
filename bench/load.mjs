#!/usr/bin/env node
// Bounded load test for `tern serve` (loopback only; stops by itself).
//
//   node bench/load.mjs [--model FILE] [--clients N] [--seconds S] [--max-tokens N]
//                       [--queue N] [--bin PATH] [--prompt-words N] [--rounds R]
//                       [--env KEY=VALUE,...]
//
// Starts its own server on a free loopback port (default model: a fresh
// `tern mkmodel --preset tiny-qwen3`), measures its idle RSS, runs N concurrent
// streaming clients for S seconds (each sends a request, reads the stream to [DONE],
// repeats; a 429 is counted and retried after Retry-After), then reports requests/s,
// time to first token p50/p99, errors and 429s, waits until the server is idle again
// and compares its RSS with the idle figure. Parked sessions (the reuse cache) stay in
// memory by design, bounded by --cache-ram: so the load runs R rounds (default 2) with
// the same clients, and the check is that the RSS after the last round is no larger
// than after the first (nothing grows per request); with --env TERN_REUSE_POOL=0 only
// the live session is kept and the RSS returns close to the idle figure. SIGTERM ends the server; its exit status
// is reported — run it with an ASan/LSan build (--bin build-asan/tern) to check for
// leaks: LeakSanitizer makes the server exit non-zero when anything leaked.
//
// Concurrent streams (continuous batching, docs/SERVING.md "Concurrent requests"):
//
//   node bench/load.mjs --streams 1,2,4,8 --model FILE [--engine tern|llama]
//                       [--prompt-tokens 256] [--reply-tokens 128] [--rounds 2]
//                       [--long-prompt 4096] [--server-args "..."]
//
// For each N, a fresh server (tern serve --parallel N, or the reference llama-server
// --parallel N --cont-batching with N times the context; N + 1 with --long-prompt) gets N streaming
// /v1/completions requests at once, each a distinct prompt of random token ids and a
// reply of exactly --reply-tokens tokens (ignore_eos for llama-server), R rounds.
// Reported per N: the aggregate decode rate (the sum over streams of their decode
// tokens/s while all decode), the mean per-stream rate, the wall-clock throughput,
// and TTFT p50/p99. With --long-prompt P, while the N streams decode, one more request
// with a P-token prompt arrives: the streams' largest gap between two tokens is
// reported beside their median gap (the stall a long prompt causes).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { spawn } from 'node:child_process';

// (--server-args takes the next argument whatever it starts with: "--batch-tokens 128")
const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (i > 0 && all[i - 1] === '--server-args') return acc;
  if (a === '--server-args') acc.push(['server-args', all[i + 1] ?? 'true']);
  else if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
  return acc;
}, []));
if (args.help) {
  console.log('usage: node bench/load.mjs [--model FILE] [--clients N] [--seconds S] [--max-tokens N] [--queue N] [--bin PATH]');
  process.exit(0);
}
// The binary: --bin, else $TERN_BIN, else ./tern, else the source tree's build/tern
if (!args.bin && !process.env.TERN_BIN && !existsSync('./tern')) {
  const built = new URL('../build/tern', import.meta.url).pathname;
  if (!existsSync(built)) {
    console.error('load.mjs: no tern binary: give --bin PATH (or TERN_BIN), or build it (./scripts/build.sh build)');
    process.exit(2);
  }
  args.bin = built;
}
if (args.streams) {
  await streamsBench();
  process.exit(0);
}
const clients = Number(args.clients ?? 8);
const seconds = Math.min(Number(args.seconds ?? 20), 600);
const maxTokens = Number(args['max-tokens'] ?? 32);
const promptWords = Number(args['prompt-words'] ?? 60);
const rounds = Math.max(1, Math.min(Number(args.rounds ?? 2), 10));
const extraEnv = Object.fromEntries((args.env && args.env !== 'true' ? args.env.split(',') : [])
  .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
if (args.bin) process.env.TERN_BIN = args.bin;
// (imported after TERN_BIN is set: the harness reads it when loaded)
const { makeModel, startServer, tmp } = await import('../tests/clients/harness.mjs');

function rssKiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return m ? Number(m[1]) : NaN;
}
function pct(sorted, p) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const dir = tmp();
const model = args.model ?? makeModel(dir);
const srv = await startServer(['--model', model, '--ctx-size', '2048', '--queue', String(args.queue ?? clients)],
);
const url = srv.base + '/v1/chat/completions';

async function one(i, stats) {
  const words = Array.from({ length: promptWords }, (_, k) => `w${(i * 7 + k) % 50}`).join(' ');
  const t0 = performance.now();
  let r;
  try {
    r = await fetch(url, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: `client ${i}: ${words}` }], max_tokens: maxTokens,
        stream: true, stream_options: { include_usage: true }, session_id: `client-${i}` }),
    });
  } catch (e) {
    stats.errors++;
    return;
  }
  if (r.status === 429) {
    stats.r429++;
    await r.text();
    await sleep(Number(r.headers.get('retry-after') ?? 1) * 100);
    return;
  }
  if (r.status !== 200) {
    stats.errors++;
    await r.text();
    return;
  }
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '', first = 0, done = false;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buf += dec.decode(value, { stream: true });
    if (!first && /"(content|reasoning_content)":"[^"]/.test(buf)) first = performance.now();
    if (buf.includes('data: [DONE]')) done = true;
    if (buf.includes('event: error')) { stats.errors++; return; }
  }
  if (!done) { stats.errors++; return; }
  stats.ok++;
  if (first) stats.ttft.push(first - t0);
  const u = buf.match(/"completion_tokens":(\d+)/);
  if (u) stats.tokens += Number(u[1]);
}

// warm up, then the idle size
await one(0, { ttft: [], ok: 0, errors: 0, r429: 0, tokens: 0 });
await sleep(500);
const idle = rssKiB(srv.proc.pid);

const stats = { ttft: [], ok: 0, errors: 0, r429: 0, tokens: 0 };
let peak = idle, wall = 0;
const afterRound = [];
const sampler = setInterval(() => { peak = Math.max(peak, rssKiB(srv.proc.pid)); }, 200);
for (let round = 0; round < rounds; round++) {
  const t0 = performance.now();
  const end = t0 + seconds * 1000;
  await Promise.all(Array.from({ length: clients }, async (_, i) => {
    while (performance.now() < end) await one(i + 1, stats);
  }));
  wall += (performance.now() - t0) / 1000;
  await sleep(1000); // back to idle: the queue is empty
  afterRound.push(rssKiB(srv.proc.pid));
}
clearInterval(sampler);
const after = afterRound[afterRound.length - 1];
const met = await (await fetch(srv.base + '/metrics')).text();
const code = await srv.stop();
stats.ttft.sort((a, b) => a - b);
const report = {
  clients, rounds, seconds: Number(wall.toFixed(1)), requests: stats.ok, requests_per_s: Number((stats.ok / wall).toFixed(2)),
  generated_tokens_per_s: Number((stats.tokens / wall).toFixed(1)),
  ttft_ms_p50: Number(pct(stats.ttft, 50).toFixed(1)), ttft_ms_p99: Number(pct(stats.ttft, 99).toFixed(1)),
  errors: stats.errors, http_429: stats.r429,
  rss_idle_kib: idle, rss_peak_kib: peak, rss_after_each_round_kib: afterRound,
  rss_growth_after_first_round_kib: after - afterRound[0],
  cache_pool_bytes: Number(met.match(/^tern_cache_pool_bytes (\d+)/m)?.[1] ?? NaN),
  cache_sessions: Number(met.match(/^tern_cache_sessions (\d+)/m)?.[1] ?? NaN),
  cache_checkpoints: Number(met.match(/^tern_cache_checkpoints (\d+)/m)?.[1] ?? NaN),
  server_env: extraEnv,
  server_exit: code,
};
console.log(JSON.stringify(report, null, 2));
process.exit(stats.errors === 0 && code === 0 ? 0 : 1);

// ---- concurrent streams -------------------------------------------------------------

async function startLlama(model, n, ctx, extra) {
  const shared = process.env.TERN_SHARED_DIR || join(process.cwd(), '../shared');
  const port = 20000 + Math.floor(Math.random() * 20000);
  const proc = spawn(join(shared, 'reference/llama.cpp/run'), ['llama-server', '-m', model, '--port', String(port),
    '-t', '2', '--parallel', String(n), '--cont-batching', '-c', String(ctx * n), '--no-webui', ...extra],
  { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log = (log + d).slice(-8192); });
  proc.stdout.on('data', (d) => { log = (log + d).slice(-8192); });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 1200; i++) {
    try {
      if ((await fetch(`${base}/health`)).status === 200) break;
    } catch { /* not yet */ }
    if (proc.exitCode !== null) throw new Error(`llama-server exited: ${log}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return { proc, base, log: () => log,
    stop: () => new Promise((r) => { proc.on('exit', (c, sg) => r(c ?? sg)); proc.kill('SIGTERM'); }) };
}

// One streamed completion; the time of every token-bearing event.
async function streamOne(base, prompt, reply) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: reply, n_predict: reply, ignore_eos: true, temperature: 0,
      stream: true, stream_options: { include_usage: true }, cache_prompt: false }),
  });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '', n = 0, usage = 0;
  const times = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      const d = ev.split('\n').find((l) => l.startsWith('data: '));
      if (!d || d === 'data: [DONE]') continue;
      const j = JSON.parse(d.slice(6));
      if (j.usage?.completion_tokens) usage = j.usage.completion_tokens;
      if (j.choices?.[0]?.text) {
        n++;
        times.push(performance.now());
      }
    }
  }
  return { t0, first: times[0], end: times[times.length - 1], times, tokens: usage || n };
}

async function streamsBench() {
  const model = args.model;
  if (!model) throw new Error('--streams needs --model FILE');
  const engine = args.engine ?? 'tern';
  const ns = String(args.streams).split(',').map(Number);
  const pTok = Number(args['prompt-tokens'] ?? 256), reply = Number(args['reply-tokens'] ?? 128);
  const nRounds = Math.max(1, Number(args.rounds ?? 2));
  const longP = Number(args['long-prompt'] ?? 0);
  const extra = args['server-args'] && args['server-args'] !== 'true' ? args['server-args'].split(' ') : [];
  if (args.bin) process.env.TERN_BIN = args.bin;
  const { startServer } = await import('../tests/clients/harness.mjs');
  const ctx = pTok + reply + 64 + longP;
  let seed = 12345;
  const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
  const prompt = (len) => Array.from({ length: len }, () => 1000 + (rnd() % 20000));
  const rows = [];
  for (const n of ns) {
    const slots = n + (longP ? 1 : 0); // the long prompt runs beside the streams, not after them
    const srv = engine === 'llama' ? await startLlama(model, slots, ctx, extra)
      : await startServer(['--model', model, '--ctx-size', String(ctx), '--parallel', String(slots), '--queue',
        String(slots + 2), ...extra], { TERN_PREDICT: '0' });
    await streamOne(srv.base, prompt(pTok), 8); // warm-up
    const agg = [], per = [], tput = [], ttft = [], gapMax = [], gapMed = [];
    for (let round = 0; round < nRounds; round++) {
      const t0 = performance.now();
      const streams = Array.from({ length: n }, () => streamOne(srv.base, prompt(pTok), reply));
      let long = null;
      if (longP) {
        await new Promise((r) => setTimeout(r, 1500));
        long = streamOne(srv.base, prompt(longP), 4);
      }
      const res = await Promise.all(streams);
      if (long) await long;
      const wall = (performance.now() - t0) / 1000;
      // the window in which every stream decodes: from the last first token to the first end
      const from = Math.max(...res.map((x) => x.first)), to = Math.min(...res.map((x) => x.end));
      let inWin = 0;
      for (const x of res) inWin += x.times.filter((t) => t > from && t <= to).length;
      agg.push(to > from ? inWin / ((to - from) / 1000) : NaN);
      per.push(res.reduce((a, x) => a + (x.tokens - 1) / ((x.end - x.first) / 1000), 0) / n);
      tput.push(res.reduce((a, x) => a + x.tokens, 0) / wall);
      for (const x of res) {
        ttft.push(x.first - x.t0);
        const gaps = x.times.slice(1).map((t, i) => t - x.times[i]).sort((a, b) => a - b);
        gapMax.push(gaps[gaps.length - 1]);
        gapMed.push(gaps[Math.floor(gaps.length / 2)]);
      }
    }
    await srv.stop();
    ttft.sort((a, b) => a - b);
    const mean = (v) => v.reduce((a, b) => a + b, 0) / v.length;
    rows.push({
      engine, streams: n, aggregate_decode_tok_s: +mean(agg).toFixed(1), per_stream_tok_s: +mean(per).toFixed(1),
      throughput_tok_s: +mean(tput).toFixed(1), ttft_ms_p50: +pct(ttft, 50).toFixed(0),
      ttft_ms_p99: +pct(ttft, 99).toFixed(0),
      ...(longP ? { gap_ms_max: +Math.max(...gapMax).toFixed(0), gap_ms_median: +mean(gapMed).toFixed(0) } : {}),
    });
    console.error(JSON.stringify(rows[rows.length - 1]));
  }
  console.log(JSON.stringify(rows, null, 2));
}
