#!/usr/bin/env node
// Captures the request a real coding agent sends, for `tern replay --shape`: runs Claude
// Code (`claude -p`) or Codex (`codex exec`) once against a loopback stand-in server that
// records every request body and answers "ok" in the client's protocol, then writes the
// largest body (the main conversation's request: system prompt and tools) to OUT.
//
//   node bench/agent-shape.mjs claude OUT.json
//   node bench/agent-shape.mjs codex OUT.json
//
// The clients come from tests/clients/agents (./scripts/deps.sh --agents). Nothing is
// committed: the system prompts and tool lists are the clients' own text, captured on
// the machine that measures.
import { createServer } from 'node:http';
import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const [which, out] = process.argv.slice(2);
if (!['claude', 'codex'].includes(which) || !out) {
  console.error('usage: node bench/agent-shape.mjs claude|codex OUT.json');
  process.exit(2);
}
const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const bin = join(root, 'tests', 'clients', 'agents', 'node_modules', '.bin', which);

const bodies = [];
const sse = (res, events) => {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  for (const [name, data] of events) res.write(`event: ${name}\ndata: ${JSON.stringify(data)}\n\n`);
  res.end();
};
function answerMessages(body, res) {
  const usage = { input_tokens: 1, output_tokens: 1, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 };
  const msg = { id: 'msg_capture', type: 'message', role: 'assistant', model: body.model, content: [], stop_reason: null, stop_sequence: null, usage };
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ ...msg, content: [{ type: 'text', text: 'ok' }], stop_reason: 'end_turn' }));
  }
  sse(res, [['message_start', { type: 'message_start', message: msg }],
    ['content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }],
    ['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'ok' } }],
    ['content_block_stop', { type: 'content_block_stop', index: 0 }],
    ['message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage }],
    ['message_stop', { type: 'message_stop' }]]);
}
function answerResponses(body, res) {
  const item = { id: 'msg_capture_0', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'ok', annotations: [] }] };
  const resp = (status, output, usage) => ({ id: 'resp_capture', object: 'response', created_at: 0, status, model: body.model, output, usage });
  const usage = { input_tokens: 1, input_tokens_details: { cached_tokens: 0 }, output_tokens: 1, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 2 };
  let seq = 0;
  const ev = (type, data) => [type, { type, sequence_number: seq++, ...data }];
  sse(res, [ev('response.created', { response: resp('in_progress', [], null) }),
    ev('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', content: [] } }),
    ev('response.output_text.delta', { item_id: item.id, output_index: 0, content_index: 0, delta: 'ok' }),
    ev('response.output_item.done', { output_index: 0, item }),
    ev('response.completed', { response: resp('completed', [item], usage) })]);
}

const server = createServer((req, res) => {
  let data = '';
  req.on('data', (d) => { data += d; });
  req.on('end', () => {
    const path = req.url.split('?')[0];
    if (req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ object: 'list', data: [{ id: 'tern', object: 'model', type: 'model', display_name: 'tern', created_at: '2026-01-01T00:00:00Z' }], has_more: false }));
    }
    let body = {};
    try { body = JSON.parse(data); } catch { /* keep {} */ }
    if (path.endsWith('/count_tokens')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ input_tokens: 1 }));
    }
    bodies.push(data);
    if (path.endsWith('/messages')) return answerMessages(body, res);
    if (path.endsWith('/responses')) return answerResponses(body, res);
    res.writeHead(404);
    res.end();
  });
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;

const home = mkdtempSync(join(tmpdir(), 'agent-shape-'));
const work = join(home, 'work');
mkdirSync(work);
let args, env = { PATH: process.env.PATH, HOME: home };
if (which === 'claude') {
  args = ['-p', 'Say hello', '--model', 'tern'];
  Object.assign(env, { ANTHROPIC_BASE_URL: base, ANTHROPIC_API_KEY: 'capture', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_AUTOUPDATER: '1' });
} else {
  mkdirSync(join(home, '.codex'));
  writeFileSync(join(home, '.codex', 'config.toml'), `model = "tern"\nmodel_provider = "tern"\n\n[model_providers.tern]\nname = "tern"\nbase_url = "${base}/v1"\nwire_api = "responses"\nenv_key = "TERN_API_KEY"\n`);
  args = ['exec', '--skip-git-repo-check', 'Say hello'];
  env.TERN_API_KEY = 'capture';
}
const code = await new Promise((resolve) => {
  const p = spawn(bin, args, { cwd: work, env, stdio: ['ignore', 'ignore', 'inherit'] });
  const t = setTimeout(() => p.kill('SIGKILL'), 120000);
  p.on('close', (c) => { clearTimeout(t); resolve(c); });
});
server.close();
rmSync(home, { recursive: true, force: true });
if (!bodies.length) {
  console.error(`${which} exited ${code} without a request`);
  process.exit(1);
}
const main = bodies.reduce((a, b) => (b.length > a.length ? b : a));
writeFileSync(out, main);
const o = JSON.parse(main);
console.error(`${which}: exit ${code}, ${bodies.length} request(s); kept ${main.length} bytes: `
  + `${(o.tools || []).length} tools, system ${JSON.stringify(o.system ?? o.instructions ?? '').length} bytes`);
