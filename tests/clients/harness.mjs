// Shared helpers for the server tests driven from node: make a small model with
// `tern mkmodel`, start `tern serve` on a free loopback port, stop it.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const bin = process.env.TERN_BIN || './tern';
export const sourceDir = process.env.TERN_SOURCE_DIR || process.cwd();

export function skip(why) {
  console.log(`SKIP: ${why}`);
  process.exit(77);
}

// TERN_TEST_DEVICE=vulkan:N (the device twins of the e2e tests, e.g. reuse-e2e-vulkan):
// every server below runs its sessions on that device and must say so at start. Without
// the device the test is skipped, or fails with TERN_REQUIRE_VULKAN=1.
export const testDevice = process.env.TERN_TEST_DEVICE || '';
if (testDevice) {
  const m = testDevice.match(/^vulkan:(\d+)$/);
  if (!m) throw new Error(`TERN_TEST_DEVICE=${testDevice}: expected vulkan:N`);
  const r = spawnSync(bin, ['devices', '--json'], { encoding: 'utf8' });
  if (!(r.stdout || '').includes(`"index":${m[1]}`)) {
    const why = `TERN_TEST_DEVICE=${testDevice} but tern devices does not list it: ${r.stdout}${r.stderr}`;
    if (process.env.TERN_REQUIRE_VULKAN === '1') throw new Error(why);
    skip(why);
  }
}

// A temporary directory removed at exit.
export function tmp() {
  const d = mkdtempSync(join(tmpdir(), 'tern-srv-'));
  process.on('exit', () => rmSync(d, { recursive: true, force: true }));
  return d;
}

// A tiny random qwen3 model with the generator's built-in Qwen-style vocabulary
// (<|im_start|>, <think>, <tool_call> ... and a ChatML template).
export function makeModel(dir, extra = []) {
  const out = join(dir, 'model.gguf');
  const r = spawnSync(bin, ['mkmodel', '--preset', 'tiny-qwen3', '--type', 'q8_0', '--out', out, ...extra],
    { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`tern mkmodel failed: ${r.stderr}`);
  return out;
}

// Starts `tern serve` with args on port 0; resolves once /health says 200.
export async function startServer(args, env = {}) {
  const dev = testDevice && !args.includes('--device') ? ['--device', testDevice] : [];
  const proc = spawn(bin, ['serve', '--port', '0', '--threads', '2', ...dev, ...args], {
    env: { ...process.env, TERN_LOG: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  let timer;
  const port = await new Promise((resolve, reject) => {
    const onData = (d) => {
      log = (log + d.toString()).slice(-65536);
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    };
    proc.stderr.on('data', onData);
    proc.stdout.on('data', onData);
    proc.on('exit', (code) => reject(new Error(`tern serve exited ${code}: ${log}`)));
    timer = setTimeout(() => reject(new Error(`tern serve did not start: ${log}`)), 60000);
  }).finally(() => clearTimeout(timer));
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; i++) {
    try {
      const r = await fetch(`${base}/health`);
      if (r.status === 200) break;
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  // the model is loaded (or failed): a device server has said which device it took
  if (dev.length && !log.includes(`device: ${testDevice} `)) {
    proc.kill('SIGKILL');
    throw new Error(`tern serve --device ${testDevice} did not say it took the device: ${log}`);
  }
  return {
    proc, port, base,
    log: () => log,
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      const done = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
      proc.kill('SIGTERM');
      return done;
    },
  };
}

export function requireOpenAI() {
  const p = join(sourceDir, 'third_party', 'node_modules', 'openai');
  if (!existsSync(p)) skip(`the openai npm package is not installed (${p}); run ./scripts/deps.sh`);
  return p;
}

// Parses an SSE body into frames: {data, event, comment}.
export function sseFrames(text) {
  const frames = [];
  for (const block of text.split('\n\n')) {
    if (!block) continue;
    const f = { data: null, event: null, comment: null };
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) f.comment = line.slice(1).trim();
      else if (line.startsWith('data: ')) f.data = line.slice(6);
      else if (line.startsWith('event: ')) f.event = line.slice(7);
    }
    frames.push(f);
  }
  return frames;
}

// The first match of re in the server's log, waiting for it (bounded: 5 s).
export async function logged(srv, re) {
  for (let i = 0; i < 250; i++) {
    const m = srv.log().match(re);
    if (m) return m;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`not in the log: ${re}`);
}

// "n_past hash" of the state a request left (TERN_STATE_HASH=1 logs it).
export const stateHash = async (srv, id) =>
  (await logged(srv, new RegExp(`state-hash ${id} n_past=(\\d+) total=([0-9a-f]{16})`))).slice(1).join(' ');

// A logit_bias that bans the model's end tokens (those of its ChatML end texts), for a
// request that must still be running when the test acts on it: a random-weight model
// samples an end token early now and then (a 200 after 3 tokens, 1 in ~60 under ASan).
export async function banEnds(srv) {
  const bias = {};
  for (const text of ['<|im_end|>', '<|endoftext|>']) {
    const r = await fetch(srv.base + '/tokenize', {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content: text }),
    });
    const ids = (await r.json()).tokens;
    if (ids.length === 1) bias[ids[0]] = -100;
  }
  if (!Object.keys(bias).length) throw new Error('the model has none of the ChatML end tokens');
  return bias;
}
