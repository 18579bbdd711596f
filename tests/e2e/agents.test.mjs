// The coding agents most people run, unmodified, against `tern serve`: Claude Code
// (`claude -p`, then `claude -p --continue`; the Anthropic Messages API) and Codex
// (`codex exec`, then `codex exec resume --last`; the Responses API, through a
// model_providers entry with wire_api = "responses"). Each runs two turns with a
// throwaway HOME: both exit 0, print the server's reply, and the second turn resumes
// the first (its cached tokens >= 80 % of the first turn's prompt, from the server's
// request log). Their own system prompts and tool lists are sent (12-16K tokens).
//
// The clients are installed by the test command (scripts/deps.sh --agents; pinned in
// tests/clients/agents/package.json). A random-weight model would ramble to
// max_tokens, which both clients treat as an error, so the server dictates the reply
// (TERN_TEST_FORCED_REPLY, test-only): it still goes through the detokenizer, the reply
// parser and each protocol's renderer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { startServer, tmp, sourceDir, skip } from '../clients/harness.mjs';

const agents = join(sourceDir, 'tests', 'clients', 'agents', 'node_modules', '.bin');
const claude = join(agents, 'claude');
const codex = join(agents, 'codex');
if (!existsSync(claude) || !existsSync(codex)) {
  const why = `the agent clients are not installed in ${agents} (run ./scripts/deps.sh --agents)`;
  if (process.env.TERN_REQUIRE_AGENTS === '1') throw new Error(why);
  skip(why);
}
const shared = process.env.TERN_SHARED_DIR || process.env.TERN_SHARED_DIR_DEFAULT;
const model = shared && join(shared, 'models', 'tiny-qwen3-q8_0.gguf');
if (!model || !existsSync(model)) {
  // the kit's qwen-mini vocabulary keeps the clients' prompts near 16K tokens (the
  // built-in byte-level one would triple them)
  if ((process.env.TERN_REQUIRE_SHARED || '0') !== '0') throw new Error(`no ${model}`);
  skip('no ../shared/models/tiny-qwen3-q8_0.gguf (TERN_SHARED_DIR)');
}

const KEY = 'agent-key';
const REPLY = 'Hello from tern.';
let srv;

before(async () => {
  srv = await startServer(['--model', model, '--ctx-size', '40960', '--api-key', KEY],
    { TERN_TEST_FORCED_OUTPUT: '1', TERN_TEST_FORCED_REPLY: REPLY });
});
after(async () => { if (srv) assert.equal(await srv.stop(), 0); });

// The server's request lines for route since log offset from: [{prompt, cached}].
function requests(route, from) {
  return [...srv.log().slice(from).matchAll(new RegExp(`request \\S+ ${route} 200 prompt=(\\d+) cached=(\\d+)`, 'g'))]
    .map((m) => ({ prompt: Number(m[1]), cached: Number(m[2]) }));
}

// Runs a client to its end (async: the server's log keeps flowing meanwhile).
function run(cmd, args, env, cwd) {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    const timer = setTimeout(() => p.kill('SIGKILL'), 240000);
    p.on('close', (code, sig) => { clearTimeout(timer); resolve({ code: code ?? sig, out, err }); });
  });
}

// The request lines of a turn: they are logged before the response's last byte, but
// read from the server's pipe asynchronously (bounded wait).
async function turnRequests(route, from) {
  for (let i = 0; i < 100; i++) {
    const r = requests(route, from);
    if (r.length) return r;
    await new Promise((res) => setTimeout(res, 50));
  }
  return [];
}

// Two turns of one client; returns the server's request lines of each turn.
async function twoTurns(route, turn1, turn2) {
  const from0 = srv.log().length;
  const a = await turn1();
  assert.equal(a.code, 0, a.out + a.err);
  assert.ok(a.out.includes(REPLY), a.out);
  const first = await turnRequests(route, from0);
  const from1 = srv.log().length;
  const b = await turn2();
  assert.equal(b.code, 0, b.out + b.err);
  assert.ok(b.out.includes(REPLY), b.out);
  const second = await turnRequests(route, from1);
  assert.ok(first.length >= 1 && second.length >= 1, srv.log().slice(from0));
  const p1 = first.at(-1).prompt, s2 = second.at(-1);
  assert.ok(s2.prompt > p1, `turn 2 extends turn 1: ${s2.prompt} vs ${p1}`);
  assert.ok(s2.cached >= 0.8 * p1, `turn 2 resumed ${s2.cached} of turn 1's ${p1} tokens`);
  return { p1, s2 };
}

test('Claude Code: claude -p, then claude -p --continue (the Messages API)', async () => {
  const home = tmp();
  const work = join(home, 'work');
  mkdirSync(work);
  const env = {
    PATH: process.env.PATH, HOME: home, ANTHROPIC_BASE_URL: srv.base, ANTHROPIC_API_KEY: KEY,
    // no traffic to anywhere but the server (telemetry, updates, error reports)
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_AUTOUPDATER: '1',
  };
  const r = await twoTurns('/v1/messages',
    () => run(claude, ['-p', 'Say hello', '--model', 'tern'], env, work),
    () => run(claude, ['-p', '--continue', 'Again, please', '--model', 'tern'], env, work));
  console.log(`claude: turn 1 prompt ${r.p1} tokens; turn 2 prompt ${r.s2.prompt}, cached ${r.s2.cached}`);
});

test('Codex: codex exec, then codex exec resume --last (the Responses API)', async () => {
  const home = tmp();
  const work = join(home, 'work');
  mkdirSync(work);
  mkdirSync(join(home, '.codex'));
  writeFileSync(join(home, '.codex', 'config.toml'), [
    'model = "tern"', 'model_provider = "tern"', '',
    '[model_providers.tern]', 'name = "tern"', `base_url = "${srv.base}/v1"`, 'wire_api = "responses"',
    'env_key = "TERN_API_KEY"', ''].join('\n'));
  const env = { PATH: process.env.PATH, HOME: home, TERN_API_KEY: KEY };
  const r = await twoTurns('/v1/responses',
    () => run(codex, ['exec', '--skip-git-repo-check', 'Say hello'], env, work),
    () => run(codex, ['exec', '--skip-git-repo-check', 'resume', '--last', 'Again, please'], env, work));
  console.log(`codex: turn 1 prompt ${r.p1} tokens; turn 2 prompt ${r.s2.prompt}, cached ${r.s2.cached}`);
});
