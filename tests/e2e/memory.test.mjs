// Memory that is really bounded (issue 37, docs/SERVING.md "Memory"): --parallel requests
// that each grow to a full context run within the --cache-ram budget the server prints at
// start, measured as the process's resident memory (VmHWM, its peak), not as counters.
// Four requests of ~4,000 tokens on a model whose full context is 64 MiB of KV, against a
// 128 MiB budget: run all at once they would hold 256 MiB; admitted by memory, two run,
// the others wait, all four answer in full. Loopback only; bounded.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { bin, startServer, tmp } from '../clients/harness.mjs';

const dir = tmp();
const CTX = 4096, PROMPT = 3600, REPLY = 480, BUDGET_MIB = 128, N = 4;
// what the process may add beyond the budget: the workspace of a 4-sequence step, the
// logits, malloc's arenas (the sessions' KV pages are the budget's)
const SLACK_MIB = 48;
let srv;
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, 'tern serve exits 0 on SIGTERM');
});

// qwen3 with 4 layers of 8 KV heads of 128: 16 KiB of F16 KV per token, 64 MiB a context
function makeModel() {
  const out = join(dir, 'mem.gguf');
  const r = spawnSync(bin, ['mkmodel', '--arch', 'qwen3', '--n-layer', '4', '--n-embd', '256', '--n-head', '8',
    '--n-head-kv', '8', '--head-dim', '128', '--n-ff', '512', '--n-ctx', String(CTX), '--type', 'q8_0', '--out', out],
  { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`tern mkmodel failed: ${r.stderr}`);
  return out;
}

const status = (pid, key) => {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm'));
  return Number(m[1]) / 1024; // MiB
};

async function complete(body) {
  const r = await fetch(`${srv.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: r.status, json: await r.json() };
}

test(`${N} full-context requests at once stay within --cache-ram ${BUDGET_MIB} MiB of resident memory`, async () => {
  srv = await startServer(['--model', makeModel(), '--ctx-size', String(CTX), '--parallel', String(N),
    '--cache-ram', String(BUDGET_MIB), '--prompt-cache', '0'], { TERN_TEST_FORCED_OUTPUT: '1', TERN_PREDICT: '0' });
  assert.match(srv.log(), new RegExp(`within --cache-ram ${BUDGET_MIB} MiB \\(a full context: 64 MiB\\)`));
  // warm: the workspace and the first pages exist before the baseline is read
  const w = await complete({ prompt: [11, 12, 13], max_tokens: 2, tern_forced_output: 'ab' });
  assert.equal(w.status, 200, JSON.stringify(w.json));
  const base = status(srv.proc.pid, 'VmRSS');
  const reply = 'x'.repeat(REPLY * 2);
  const reqs = Array.from({ length: N }, (_, k) => complete({
    prompt: Array.from({ length: PROMPT }, (_, i) => 10 + ((i * 7919 + k * 131) % 200)),
    max_tokens: REPLY, tern_forced_output: reply,
  }));
  const done = await Promise.all(reqs);
  for (const r of done) {
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.usage.completion_tokens, REPLY, 'each request answered in full');
  }
  const peak = status(srv.proc.pid, 'VmHWM');
  console.log(`# resident memory: ${base.toFixed(1)} MiB before, peak ${peak.toFixed(1)} MiB ` +
    `(+${(peak - base).toFixed(1)} MiB; budget ${BUDGET_MIB} MiB; ${N} contexts would be ${N * 64} MiB)`);
  assert.match(srv.log(), /waits for memory/, 'admission held requests back');
  assert.ok(peak - base <= BUDGET_MIB + SLACK_MIB,
    `peak resident memory grew ${(peak - base).toFixed(1)} MiB, over the ${BUDGET_MIB} MiB budget + ${SLACK_MIB}`);
});
