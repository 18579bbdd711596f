// Connection exhaustion, measured from outside (loopback only, bounded):
//   node bench/conn-flood.mjs [--bin build/tern] [--model M] [--idle 300] [--slowloris 0] [--hold 15]
// starts `tern serve --port 0` on 127.0.0.1, opens N idle sockets (from 127.0.0.2, another
// loopback address, so that a per-address cap applies to them and not to the probe), plus
// optional slowloris sockets that send one header byte a second, then times GET /health
// from 127.0.0.1 every second for --hold seconds and reports each time (or 'timeout'),
// how many idle sockets the server has closed, and the server's peak RSS (VmHWM).
import { spawn } from 'node:child_process';
import net from 'node:net';
import fs from 'node:fs';

const args = process.argv.slice(2);
const opt = (k, d) => { const i = args.indexOf(k); return i >= 0 ? args[i + 1] : d; };
const bin = opt('--bin', 'build/tern');
const model = opt('--model', '../shared/models/tiny-qwen3-f32.gguf');
const nIdle = +opt('--idle', 300), nSlow = +opt('--slowloris', 0), hold = +opt('--hold', 15);
const extra = (opt('--args', '') || '').split(' ').filter(Boolean);

const srv = spawn(bin, ['serve', '--model', model, '--port', '0', '--threads', '1', ...extra],
  { stdio: ['ignore', 'pipe', 'pipe'] });
let log = '';
const port = await new Promise((res, rej) => {
  const t = setTimeout(() => rej(new Error('no listen line: ' + log)), 30000);
  const on = (d) => { log += d; const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log); if (m && /model loaded|ready|serving/i.test(log)) { clearTimeout(t); res(+m[1]); } };
  srv.stderr.on('data', on); srv.stdout.on('data', on);
}).catch(async (e) => { await new Promise((r) => setTimeout(r, 3000)); const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log); if (m) return +m[1]; throw e; });
await new Promise((r) => setTimeout(r, 1500));

function health() {
  return new Promise((res) => {
    const t0 = performance.now();
    const s = net.connect({ host: '127.0.0.1', port });
    let buf = '';
    const to = setTimeout(() => { s.destroy(); res('timeout'); }, 3000);
    s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'));
    s.on('data', (d) => { buf += d; });
    s.on('close', () => { clearTimeout(to); res(/^HTTP\/1\.1 (\d+)/.test(buf) ? `${(performance.now() - t0).toFixed(1)} ms (${RegExp.$1})` : `closed (${buf.length} bytes)`); });
    s.on('error', () => {});
  });
}

console.log('before: /health', await health());
let closed = 0;
const socks = [];
for (let i = 0; i < nIdle + nSlow; i++) {
  const s = net.connect({ host: '127.0.0.1', port, localAddress: '127.0.0.2' });
  s.on('error', () => {});
  s.on('close', () => { closed++; });
  s.resume(); // read what the server sends (a 408), so that its close is seen
  socks.push(s);
  if (i >= nIdle) {
    const msg = 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(1000);
    let k = 0;
    const iv = setInterval(() => { if (s.destroyed || k >= msg.length) return clearInterval(iv); s.write(msg[k++]); }, 1000);
  }
}
await new Promise((r) => setTimeout(r, 500));
for (let t = 0; t < hold; t++) {
  console.log(`t=${t}s /health`, await health(), `idle sockets closed by the server: ${closed}/${nIdle + nSlow}`);
  await new Promise((r) => setTimeout(r, 1000));
}
const st = fs.readFileSync(`/proc/${srv.pid}/status`, 'utf8');
console.log('server', /VmHWM:\s+\d+ kB/.exec(st)[0], /VmRSS:\s+\d+ kB/.exec(st)[0], /Threads:\s+\d+/.exec(st)[0]);
for (const s of socks) s.destroy();
srv.kill('SIGTERM');
await new Promise((r) => srv.on('exit', r));
