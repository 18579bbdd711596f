// The edges of issue 37's adversarial round (docs/SERVING.md, "Limits and abuse"): raw
// HTTP framing libmicrohttpd got wrong, duplicate JSON keys, logit_bias, a chat of more
// messages than the context holds, SIGHUP. Loopback only; every wait is bounded.
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { makeModel, startServer, tmp } from '../clients/harness.mjs';

let srv, model;
const dir = tmp();
const CTX = 64;

before(async () => {
  model = makeModel(dir);
  srv = await startServer(['--model', model, '--ctx-size', String(CTX), '--max-body', '65536']);
});
after(async () => {
  if (srv && srv.proc.exitCode === null) await srv.stop();
});

// Sends raw bytes, returns everything read until the server closes (or 10 s pass).
function raw(bytes) {
  return new Promise((resolve) => {
    const sock = net.connect(srv.port, '127.0.0.1');
    const chunks = [];
    const timer = setTimeout(() => { sock.destroy(); resolve({ text: Buffer.concat(chunks).toString('latin1'), closed: false }); }, 10000);
    sock.on('data', (d) => chunks.push(d));
    sock.on('error', () => {});
    sock.on('close', () => { clearTimeout(timer); resolve({ text: Buffer.concat(chunks).toString('latin1'), closed: true }); });
    sock.write(Buffer.from(bytes, 'latin1'));
  });
}

const statusLines = (t) => (t.match(/HTTP\/1\.1 \d{3} /g) || []);

async function post(path, body) {
  const r = await fetch(srv.base + path, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, text, json };
}

test('Content-Length with leading zeros is a length', async () => {
  const body = '{"content":"abcde"}';
  const r = await raw(`POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 00${body.length}\r\n\r\n${body}`);
  assert.match(r.text, /^HTTP\/1\.1 200 /, r.text);
});

test('a Content-Length past 64 bits gets one 413', async () => {
  const r = await raw('POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n{}');
  assert.match(r.text, /^HTTP\/1\.1 413 /, r.text);
  assert.deepEqual(statusLines(r.text).length, 1, r.text);
  assert.ok(r.closed);
});

test('a chunk size of 16 hex digits gets a 400, not a silent close', async () => {
  const r = await raw('POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n{"content":"ab"}\r\n0\r\n\r\n');
  assert.match(r.text, /^HTTP\/1\.1 400 /, r.text);
  assert.match(r.text, /chunk size/);
  assert.equal(statusLines(r.text).length, 1, r.text);
  // a chunk larger than --max-body: 413 at once
  const big = await raw('POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\nab');
  assert.match(big.text, /^HTTP\/1\.1 413 /, big.text);
});

test('a NUL in a header value, and HTTP/1.1 without Host, are refused with 400', async () => {
  const body = '{"content":"ab"}';
  const nul = await raw(`POST /tokenize HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
  assert.match(nul.text, /^HTTP\/1\.1 400 /, nul.text);
  assert.match(nul.text, /NUL/);
  const nohost = await raw(`POST /tokenize HTTP/1.1\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
  assert.match(nohost.text, /^HTTP\/1\.1 400 /, nohost.text);
  assert.match(nohost.text, /Host/);
  // HTTP/1.0 needs no Host
  const h10 = await raw(`POST /tokenize HTTP/1.0\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
  assert.match(h10.text, /^HTTP\/1\.[01] 200 /, h10.text);
});

test('duplicate JSON keys are refused with 400', async () => {
  const r = await post('/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"max_tokens":2}');
  assert.equal(r.status, 400, r.text);
  assert.match(r.json.error.message, /appears twice/);
  const t = await post('/tokenize', '{"content":"a","content":"b"}');
  assert.equal(t.status, 400, t.text);
});

test('logit_bias is applied (also under a grammar) and validated', async () => {
  const tok = await post('/tokenize', { content: 'a' });
  assert.equal(tok.status, 200, tok.text);
  assert.equal(tok.json.tokens.length, 1);
  const a = tok.json.tokens[0];
  const chat = (extra) => post('/v1/chat/completions', {
    messages: [{ role: 'user', content: 'hi' }], temperature: 0, max_tokens: 3, ...extra });
  const r = await chat({ logit_bias: { [a]: 100 } });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'aaa');
  // a grammar masks first: the biased token is not allowed where JSON must start
  const g = await chat({ logit_bias: { [a]: 100 }, response_format: { type: 'json_object' } });
  assert.equal(g.status, 200, g.text);
  assert.ok(!g.json.choices[0].message.content.startsWith('a'), g.text);
  // completions too; and -100 bans a token (the bias on 'a' outweighed by the ban)
  const c = await post('/v1/completions', { prompt: 'a', temperature: 0, max_tokens: 4, logit_bias: { [a]: 100 } });
  assert.equal(c.json.choices[0].text, 'aaaa');
  const ban = await post('/v1/completions', { prompt: 'a', temperature: 0, max_tokens: 4, logit_bias: { [a]: -100 } });
  assert.equal(ban.status, 200, ban.text);
  assert.ok(!ban.json.choices[0].text.includes('a'), ban.text);
  for (const bad of [{ 99999999: 1 }, { [a]: 101 }, { [a]: 'x' }, { '-1': 1 }, { '01': 1 }, [1], 5]) {
    const e = await chat({ logit_bias: bad });
    assert.equal(e.status, 400, `${JSON.stringify(bad)}: ${e.text}`);
    assert.equal(e.json.error.param, 'logit_bias');
  }
  const many = Object.fromEntries(Array.from({ length: 1025 }, (_, i) => [String(i), 1]));
  assert.equal((await chat({ logit_bias: many })).status, 400);
  assert.equal((await chat({ logit_bias: {} })).status, 200);
  assert.equal((await chat({ logit_bias: null })).status, 200);
});

test('a chat of more messages than the context holds is refused before it is rendered', async () => {
  const messages = Array.from({ length: 1000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: 'x' }));
  const r = await post('/v1/chat/completions', { messages, max_tokens: 1 });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.code, 'context_length_exceeded');
  assert.match(r.json.error.message, /1000 messages; each takes at least one token/);
});

test('SIGHUP stops the server gracefully (exit 0)', async () => {
  const done = new Promise((r) => srv.proc.on('exit', (code, sig) => r(code ?? sig)));
  srv.proc.kill('SIGHUP');
  assert.equal(await done, 0);
});
