// What a request that arrives mid-prediction pays (issue 9: the added TTFT from
// pre-emption should be at most one idle priming step).
//
//   node bench/predict-preempt.mjs --tern build/tern --model M.gguf [--chunk 128] [--trials 12]
//                                  [--tool-lines 60] [--threads 2]
//
// It dictates the outputs (TERN_TEST_FORCED_OUTPUT): the binary must be built with the test
// hooks (scripts/test.sh's build/, or cmake -DTERN_TEST_HOOKS=ON).
//
// One server with predictive priming (--predict-chunk CHUNK) and forced output. Each
// trial plays a conversation of a session of its own: a tool-calling turn with a long
// tool result, then a final answer. That answer's prediction (the history re-rendered
// without reasoning) takes a while to prime; the next request (a new user message) is
// sent at a point spread over that time. Reported per trial: how long it waited for the
// pre-emption (the server's preempt_wait, from enqueue to the worker taking it), its
// TTFT, and — for scale — the time of one step (CHUNK tokens, measured from the
// server's own "primed N in S" lines). Nothing here is a pass/fail condition.
import { spawn } from 'node:child_process';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const bin = arg('tern', './tern');
const model = arg('model');
const chunk = Number(arg('chunk', '128'));
const trials = Number(arg('trials', '12'));
const toolLines = Number(arg('tool-lines', '60'));
const threads = arg('threads', '2');
if (!model) {
  console.error('usage: node bench/predict-preempt.mjs --tern BIN --model FILE [--chunk N] [--trials N]');
  process.exit(2);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function start() {
  const proc = spawn(bin, ['serve', '--model', model, '--port', '0', '--threads', threads, '--predict-chunk', String(chunk)],
    { env: { ...process.env, TERN_TEST_FORCED_OUTPUT: '1', TERN_LOG: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const on = (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    };
    proc.stderr.on('data', on);
    proc.stdout.on('data', on);
    proc.on('exit', (c) => reject(new Error(`tern serve exited ${c}: ${log}`)));
  });
  proc.stderr.on('data', (d) => { log += d.toString(); });
  const base = `http://127.0.0.1:${port}`;
  for (;;) {
    try { if ((await fetch(`${base}/health`)).status === 200) break; } catch { /* not yet */ }
    await sleep(100);
  }
  return { proc, base, log: () => log };
}

async function metrics(base) {
  const m = {};
  for (const line of (await (await fetch(`${base}/metrics`)).text()).split('\n')) {
    const k = line.match(/^([a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$/);
    if (k) m[k[1]] = Number(k[2]);
  }
  return m;
}

async function settle(base) {
  for (;;) {
    const m = await metrics(base);
    if (m.tern_predict_active === 0 && m.tern_engine_busy === 0) return;
    await sleep(20);
  }
}

// A streamed request; returns TTFT (first byte of output) and the final usage.
async function chat(base, body) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let text = '', ttft = null, usage = null, tern = null, msg = { role: 'assistant', content: '', reasoning_content: '' };
  const calls = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
    let i;
    while ((i = text.indexOf('\n\n')) >= 0) {
      const ev = text.slice(0, i);
      text = text.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const c = JSON.parse(ev.slice(6));
      if (c.usage) usage = c.usage;
      if (c.tern) tern = c.tern;
      for (const ch of c.choices) {
        const d = ch.delta;
        if (ttft === null && (d.content || d.reasoning_content || d.tool_calls)) ttft = performance.now() - t0;
        if (d.content) msg.content += d.content;
        if (d.reasoning_content) msg.reasoning_content += d.reasoning_content;
        for (const tc of d.tool_calls || []) {
          if (!calls[tc.index]) calls[tc.index] = { id: tc.id, type: 'function', function: { name: tc.function.name, arguments: '' } };
          calls[tc.index].function.arguments += tc.function.arguments || '';
        }
      }
    }
  }
  if (calls.length) msg.tool_calls = calls;
  return { ttft: ttft ?? performance.now() - t0, usage, tern, msg };
}

const tools = [{ type: 'function', function: { name: 'read', parameters: { type: 'object', properties: { path: { type: 'string' } } } } }];
const srv = await start();
const results = [];
for (let t = 0; t < trials; t++) {
  const s = `bench-${t}`;
  const msgs = [{ role: 'system', content: 'You are a coding agent.' }, { role: 'user', content: `Explain file${t}.c.` }];
  const base = { model: 'x', tools, temperature: 0, session_id: s };
  const r1 = await chat(srv.base, { ...base, messages: msgs, max_tokens: 400,
    tern_forced_output: `<think>\nRead it.\n</think>\n\n<tool_call>\n{"name": "read", "arguments": {"path": "file${t}.c"}}\n</tool_call>` });
  const lines = Array.from({ length: toolLines }, (_, i) => `static int f${i}(int x) { return x * ${i} + ${t}; }`).join('\n');
  msgs.push(r1.msg, { role: 'tool', tool_call_id: r1.msg.tool_calls[0].id, content: lines });
  await settle(srv.base);
  const before = await metrics(srv.base);
  await chat(srv.base, { ...base, messages: msgs, max_tokens: 400,
    tern_forced_output: `<think>\nThe functions are affine.\n</think>\n\nEach f${t} is an affine map.` });
  // the re-rendered history is being primed now; arrive somewhere inside it
  const delay = 20 + ((t * 97) % 10) * 40;
  await sleep(delay);
  msgs.push({ role: 'user', content: 'Which one is largest?' });
  const r3 = await chat(srv.base, { ...base, messages: msgs, max_tokens: 1 });
  const after = await metrics(srv.base);
  const waits = after.tern_preempt_wait_seconds_count - before.tern_preempt_wait_seconds_count;
  results.push({ delay, ttft: r3.ttft, preempted: waits > 0,
    wait: waits > 0 ? (after.tern_preempt_wait_seconds_sum - before.tern_preempt_wait_seconds_sum) * 1000 : 0,
    tier: r3.tern?.reuse?.tier, cached: r3.usage.prompt_tokens_details.cached_tokens, prompt: r3.usage.prompt_tokens });
  await settle(srv.base);
}
// one step's time from the server's own priming lines (those that ran to the end and
// primed at least one full step): tokens primed / seconds
const rates = [...srv.log().matchAll(/primed (\d+) in ([0-9.]+)s$/gm)].map((m) => [Number(m[1]), Number(m[2])])
  .filter(([n, s]) => n >= chunk && s > 0);
const tps = rates.length ? rates.reduce((a, [n]) => a + n, 0) / rates.reduce((a, [, s]) => a + s, 0) : NaN;
console.log(`predict chunk ${chunk} tokens; idle priming ${tps.toFixed(0)} tok/s => one step ~ ${(1000 * chunk / tps).toFixed(0)} ms`);
console.log('trial  sent-after  preempted  wait(ms)  ttft(ms)  tier       cached/prompt');
results.forEach((r, i) => console.log(`${String(i).padStart(5)}  ${String(r.delay).padStart(8)}ms  ${String(r.preempted).padEnd(9)}  ` +
  `${r.wait.toFixed(1).padStart(8)}  ${r.ttft.toFixed(0).padStart(8)}  ${String(r.tier).padEnd(9)}  ${r.cached}/${r.prompt}`));
const pre = results.filter((r) => r.preempted);
if (pre.length) {
  const w = pre.map((r) => r.wait).sort((a, b) => a - b);
  console.log(`pre-empted ${pre.length}/${results.length}: wait median ${w[w.length >> 1].toFixed(1)} ms, max ${w[w.length - 1].toFixed(1)} ms`);
}
srv.proc.kill('SIGTERM');
