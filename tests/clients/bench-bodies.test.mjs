// The real agent request bodies of ../shared/bench (qwen-code's 80-150 KB bodies with
// 14 tools and content-part arrays; compact agents; compaction) sent to tern serve as
// they are: each must be accepted — parsed, normalised, rendered with the model's
// Qwen3 template and tokenized — and either served or refused only because the prompt
// is longer than the small test context. Needs ../shared (skips without it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { startServer, skip } from './harness.mjs';

const shared = process.env.TERN_SHARED_DIR || process.env.TERN_SHARED_DIR_DEFAULT;
if (!shared || !existsSync(join(shared, 'bench'))) {
  if ((process.env.TERN_REQUIRE_SHARED || '0') !== '0') throw new Error(`no ${shared}/bench, and TERN_REQUIRE_SHARED is set`);
  skip('no ../shared/bench (TERN_SHARED_DIR)');
}

test('the real agent request bodies of ../shared/bench are accepted', async (t) => {
  const benchDir = join(shared, 'bench');
  // The shared tiny qwen3 model carries the Qwen3 chat template and a Qwen-style
  // vocabulary: the bodies render as a real deployment renders them.
  const model = join(shared, 'models', 'tiny-qwen3-q8_0.gguf');
  const s3 = await startServer(['--model', model, '--ctx-size', process.env.TERN_BENCH_CTX || '3072', '--max-body', '1000000']);
  t.after(() => s3.stop());
  let n = 0, served = 0;
  for (const f of readdirSync(benchDir).filter((x) => x.endsWith('.jsonl')).sort()) {
    const lines = readFileSync(join(benchDir, f), 'utf8').split('\n').filter(Boolean);
    for (const line of lines) {
      const body = { ...JSON.parse(line).request, max_tokens: 1, stream: false };
      // Sent as raw bytes (as qwen-code sends them); the SDK would re-serialize.
      const r = await fetch(s3.base + '/v1/chat/completions', {
        method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' },
      });
      const j = await r.json();
      // Parsed, normalised, rendered and tokenized: either served, or refused only
      // because the prompt is longer than this small test context.
      if (r.status === 200) served++;
      else assert.equal(j.error?.code, 'context_length_exceeded', `${f}: ${JSON.stringify(j)}`);
      n++;
    }
  }
  assert.ok(n >= 100, `${n} requests`);
  assert.ok(served >= 1, 'at least the short first turns were served');
  console.log(`bench bodies: ${n} accepted, ${served} served within the test context`);
});
