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
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
  return acc;
}, []));
if (args.help) {
  console.log('usage: node bench/load.mjs [--model FILE] [--clients N] [--seconds S] [--max-tokens N] [--queue N] [--bin PATH]');
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
