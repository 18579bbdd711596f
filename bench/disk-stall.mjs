#!/usr/bin/env node
// The pause a disk-tier write causes to a stream that is decoding beside it.
//
//   node bench/disk-stall.mjs --model FILE [--bin build/tern] [--context N] [--threads 2]
//                             [--stream-tokens 300] [--modes worker,writer]
//
// It dictates the outputs (TERN_TEST_FORCED_OUTPUT): the binary must be built with the test
// hooks (scripts/test.sh's build/, or cmake -DTERN_TEST_HOOKS=ON).
//
// For each mode ("writer": the disk tier's writer thread; "worker": TERN_DISK_WRITER=0,
// the write in the worker between steps, as before) a fresh server with --cache-dir:
// conversation A reads a system prompt of about --context tokens (turn 1, written to
// disk); then stream B decodes --stream-tokens forced tokens while A's turn 2 (a few
// tokens more) runs and parks, so that A's conversation is written again while B streams
// (file format 2: what the file lacks is appended, from the KV page turn 2 changed on).
// Reports A's write (bytes, time from the server's debug log) and B's inter-token gaps:
// the median over the stream and the largest from A's response to the moment its write
// was counted. Figures only: nothing here is a pass/fail condition.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const model = arg('model');
if (!model) {
  console.error('disk-stall: --model FILE is required');
  process.exit(2);
}
process.env.TERN_BIN = arg('bin', process.env.TERN_BIN || 'build/tern');
const { startServer } = await import('../tests/clients/harness.mjs');
const context = Number(arg('context', '2000'));
const threads = arg('threads', '2');
const nStream = Number(arg('stream-tokens', '300'));
const dir = mkdtempSync(join(tmpdir(), 'tern-disk-stall-'));
process.on('exit', () => rmSync(dir, { recursive: true, force: true }));

const words = 'the parser reads tokens from the lexer and builds a tree of nodes for each expression'.split(' ');
const text = (n, seed) => Array.from({ length: n }, (_, i) => words[(i * 7 + seed) % words.length]).join(' ');
// (about --context tokens with mkmodel's byte-level vocabulary, ~3.4 tokens a word; fewer
// with a real one)
const SYS = { role: 'system', content: `You are a coding agent. ${text(Math.round(context / 3.4), 1)}` };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function metric(srv, name) {
  const t = await (await fetch(`${srv.base}/metrics`)).text();
  const m = t.match(new RegExp(`^${name} (\\d+)`, 'm'));
  return m ? Number(m[1]) : 0;
}

async function writes(srv, n) {
  for (;;) {
    if ((await metric(srv, 'tern_cache_disk_writes_total')) >= n) return performance.now();
    await sleep(5);
  }
}

// Streams a request; calls onToken(t) with the arrival time of each content event.
async function stream(srv, body, onToken) {
  const r = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ temperature: 0, stream: true, ...body }),
  });
  if (r.status !== 200) throw new Error(await r.text());
  const dec = new TextDecoder();
  let buf = '';
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const data = buf.slice(0, k).split('\n').find((l) => l.startsWith('data: '))?.slice(6);
      buf = buf.slice(k + 2);
      if (!data || data === '[DONE]') continue;
      if (JSON.parse(data).choices?.[0]?.delta?.content) onToken(performance.now());
    }
  }
}

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

async function run(mode) {
  const env = { TERN_PREDICT: '0', TERN_TEST_FORCED_OUTPUT: '1', TERN_LOG: 'debug',
    ...(mode === 'worker' ? { TERN_DISK_WRITER: '0' } : {}) };
  const srv = await startServer(['--model', model, '--threads', threads, '--ctx-size', String(2 * context + 1024),
    '--cache-dir', join(dir, mode)], env);
  try {
    const key = { session_id: 'long' };
    const t1 = [SYS, { role: 'user', content: 'Turn one.' }];
    await stream(srv, { ...key, messages: t1, max_tokens: 2 }, () => {});
    await writes(srv, 1);
    const arrivals = [];
    const b = stream(srv, { session_id: 'streamer', max_tokens: nStream + 8, tern_forced_output: 'tok '.repeat(nStream),
      messages: [{ role: 'user', content: 'Stream.' }] }, (t) => arrivals.push(t));
    while (arrivals.length < 20) await sleep(5);
    const t2 = [...t1, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'Turn two.' }];
    await stream(srv, { ...key, messages: t2, max_tokens: 2 }, () => {});
    const tA = performance.now();
    const tW = await writes(srv, 2);
    await b;
    const gaps = arrivals.slice(1).map((t, i) => t - arrivals[i]);
    let worst = 0;
    for (let i = 1; i < arrivals.length; i++)
      if (arrivals[i] >= tA && arrivals[i - 1] <= tW) worst = Math.max(worst, arrivals[i] - arrivals[i - 1]);
    // "wrote NAME (T tokens, C checkpoints, A of its F bytes[, appended]) in MS ms": A written
    // by this turn (appended, or the whole file when it was written anew), F the file's size
    const wrote = [...srv.log().matchAll(
      /disk tier: wrote \S+ \((\d+) tokens, (\d+) checkpoints, (\d+) of its (\d+) bytes[^)]*\) in ([0-9.]+) ms/g)];
    const last = wrote[wrote.length - 1];
    if (!last) throw new Error(`no disk write in the log: ${srv.log().slice(-2000)}`);
    return { mode, tokens: Number(last[1]), ckpts: Number(last[2]), mib: Number(last[3]) / 2 ** 20,
      file_mib: Number(last[4]) / 2 ** 20, write_ms: Number(last[5]),
      median_gap_ms: median(gaps), worst_gap_during_write_ms: worst, stream_tokens: arrivals.length };
  } finally {
    await srv.stop();
  }
}

const rows = [];
for (const mode of arg('modes', 'worker,writer').split(',')) rows.push(await run(mode));
console.log('| mode | conversation | written (of the file) | write | B median gap | B largest gap from A\'s response to its write counted |');
console.log('|---|---|---|---|---|---|');
for (const r of rows)
  console.log(`| ${r.mode} | ${r.tokens} tokens, ${r.ckpts} checkpoints | ${r.mib.toFixed(1)} of ${r.file_mib.toFixed(1)} MiB `
    + `| ${(r.write_ms / 1000).toFixed(2)} s `
    + `| ${r.median_gap_ms.toFixed(0)} ms | ${r.worst_gap_during_write_ms.toFixed(0)} ms |`);
