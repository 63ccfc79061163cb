// woq serve driven by the official OpenAI Node.js client (pinned in
// package-lock.json) and by raw sockets for malformed HTTP.
// Run: WOQ_BIN=build/bin/woq WOQ_MODEL_DIR=assets/models/stories260K WOQ_TEST_DATA=tests/data node tests/server/openai_client.test.mjs
// Exits 77 (CTest: skipped) when `npm ci` has not been run in tests/server (1 under WOQ_REQUIRE_REFERENCES).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { startServer as startServerFor, stop } from './woq_server.mjs';

let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch {
  // Under WOQ_REQUIRE_REFERENCES (tools/test.sh, CI) the suite must run: a failure, not a skip.
  const required = !['', '0', undefined].includes(process.env.WOQ_REQUIRE_REFERENCES);
  console.log(`${required ? 'FAIL' : 'SKIP'}: the openai package is not installed (npm ci --prefix tests/server)`);
  process.exit(required ? 1 : 77);
}

const WOQ = process.env.WOQ_BIN;
const MODEL = process.env.WOQ_MODEL_DIR;
const reference = JSON.parse(readFileSync(`${process.env.WOQ_TEST_DATA}/stories260K_greedy_once_upon_a_time.json`, 'utf8'));
const PROMPT = 'Once upon a time';

const startServer = (args) => startServerFor(WOQ, MODEL, args);

// A raw HTTP exchange: writes `payload` (without half-closing: cpp-httplib
// drops half-closed connections) and returns what arrives until the server
// closes or goes quiet for a second.
function raw(port, payload) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => socket.write(payload));
    let data = '';
    socket.on('data', (d) => (data += d));
    socket.on('end', () => resolve(data));
    socket.on('error', reject);
    socket.setTimeout(1000, () => {
      socket.destroy();
      resolve(data);
    });
  });
}

async function metrics(url) {
  return (await fetch(`${url}/metrics`)).text();
}

describe('woq serve (fp32, --parallel 8)', () => {
  let server;
  let client;
  let model;
  before(async () => {
    server = await startServer(['--low-bit', 'fp32', '--parallel', '8']);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    model = (await client.models.list()).data[0].id;
  });
  after(async () => {
    const { code } = await stop(server);
    assert.equal(code, 0, server.log());
  });

  test('models and health', async () => {
    assert.equal(model, 'stories260K');
    const info = await client.models.retrieve(model);
    assert.equal(info.id, model);
    // "created": when the server started (Unix seconds), as vLLM reports it; not 0.
    const now = Math.floor(Date.now() / 1000);
    assert.ok(info.created > now - 3600 && info.created <= now, `created ${info.created}`);
    assert.equal((await client.models.list()).data[0].created, info.created);
    const health = await fetch(`${server.url}/health`);
    assert.deepEqual(await health.json(), { status: 'ok' });
  });

  test('completions: greedy text equals the reference continuation', async () => {
    const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 60, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices[0].text, reference.text.slice(PROMPT.length));
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.deepEqual(r.usage, { prompt_tokens: 5, completion_tokens: 60, total_tokens: 65,
                                 prompt_tokens_details: { cached_tokens: 0 } });
  });

  test('completions: stop strings, logprobs, seed', async () => {
    const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 60, temperature: 0, stop: ['park'], logprobs: 2 });
    const full = reference.text.slice(PROMPT.length);
    assert.equal(r.choices[0].text, full.slice(0, full.indexOf('park')));
    assert.equal(r.choices[0].finish_reason, 'stop');
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, lp.token_logprobs.length);
    assert.ok(lp.token_logprobs.every((x) => x <= 0));
    assert.equal(Object.keys(lp.top_logprobs[0]).length, 2);
    const a = await client.completions.create({ model, prompt: PROMPT, max_tokens: 30, temperature: 0.9, seed: 11 });
    const b = await client.completions.create({ model, prompt: PROMPT, max_tokens: 30, temperature: 0.9, seed: 11 });
    assert.equal(a.choices[0].text, b.choices[0].text);
  });

  test('chat: the template renders, the reply is the assistant message', async () => {
    const r = await client.chat.completions.create({
      model,
      messages: [{ role: 'system', content: 'Tell stories.' }, { role: 'user', content: 'Once upon a time' }],
      max_completion_tokens: 12,
      temperature: 0,
      logprobs: true,
      top_logprobs: 3,
    });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 12);
    assert.equal(r.choices[0].logprobs.content.length, 12);
    assert.equal(r.choices[0].logprobs.content[0].top_logprobs.length, 3);
  });

  // lm-eval's remote tokenizer (local-completions): GET /tokenizer_info, then POST /tokenize with
  // add_special_tokens false, POST /detokenize. The counts agree with what the completions report.
  test('tokenizer endpoints: tokenizer_info, tokenize, detokenize', async () => {
    const post = async (path, body) => {
      const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
      return { status: r.status, json: await r.json() };
    };
    const info = await (await fetch(`${server.url}/tokenizer_info`)).json();
    assert.equal(typeof info.eos_token, 'string');
    assert.equal(info.model_max_length, 512);
    assert.equal(typeof info.chat_template, 'string');
    const eos = await post('/tokenize', { prompt: info.eos_token, add_special_tokens: false });
    assert.equal(eos.status, 200);
    assert.equal(eos.json.count, 1);
    const plain = await post('/tokenize', { prompt: PROMPT, add_special_tokens: false });
    const special = await post('/tokenize', { prompt: PROMPT, model });
    const completion = await client.completions.create({ model, prompt: PROMPT, max_tokens: 1, temperature: 0 });
    assert.equal(special.json.count, completion.usage.prompt_tokens);
    assert.equal(special.json.count, plain.json.count + 1);  // BOS
    assert.deepEqual(special.json.tokens.slice(1), plain.json.tokens);
    assert.deepEqual(await post('/detokenize', { tokens: plain.json.tokens }), { status: 200, json: { prompt: PROMPT } });
    const messages = [{ role: 'system', content: 'Tell stories.' }, { role: 'user', content: 'Once upon a time' }];
    const chatIds = await post('/tokenize', { messages });
    const chat = await client.chat.completions.create({ model, messages, max_completion_tokens: 1, temperature: 0 });
    assert.equal(chatIds.json.count, chat.usage.prompt_tokens);
    const bad = await post('/detokenize', { tokens: [1, 99999] });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'tokens[1]');
    assert.equal((await fetch(`${server.url}/tokenize`)).status, 405);
  });

  // lm-eval's loglikelihood request (local-completions, tokenized): {"prompt": [[ids]], "max_tokens": 1,
  // "logprobs": 1, "echo": true, "temperature": 0, "seed": 1234}; it sums token_logprobs[ctxlen:-1].
  test('echo with logprobs: lm-eval\'s loglikelihood request and the openai client', async () => {
    const post = async (path, body) => {
      const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
      return { status: r.status, json: await r.json() };
    };
    const ids = (await post('/tokenize', { prompt: `${PROMPT} there was` })).json.tokens;
    const ctxlen = (await post('/tokenize', { prompt: PROMPT })).json.count;
    const r = await post('/v1/completions', { model, prompt: [ids], max_tokens: 1, logprobs: 1, echo: true, temperature: 0, seed: 1234 });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    const lp = r.json.choices[0].logprobs;
    assert.equal(lp.token_logprobs.length, ids.length + 1);  // the prompt and the generated token
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    const cont = lp.token_logprobs.slice(ctxlen, -1);
    assert.equal(cont.length, ids.length - ctxlen);
    assert.ok(cont.every((x) => x < 0));
    // max_tokens 0 scores the prompt only, with the same numbers; a string prompt gives the same tokens.
    const zero = await post('/v1/completions', { model, prompt: `${PROMPT} there was`, max_tokens: 0, logprobs: 1, echo: true });
    assert.deepEqual(zero.json.choices[0].logprobs.token_logprobs, lp.token_logprobs.slice(0, -1));
    assert.equal(zero.json.choices[0].text, `${PROMPT} there was`);
    assert.equal(zero.json.usage.completion_tokens, 0);
    // The official client parses it.
    const c = await client.completions.create({ model, prompt: PROMPT, max_tokens: 3, temperature: 0, echo: true, logprobs: 1 });
    assert.ok(c.choices[0].text.startsWith(PROMPT));
    assert.equal(c.choices[0].text, PROMPT + reference.text.slice(PROMPT.length).slice(0, c.choices[0].text.length - PROMPT.length));
    assert.equal(c.choices[0].logprobs.tokens.length, ctxlen + 3);
    // text_offset points into the echoed text: each token after the first word starts where its text does
    // (BOS decodes to nothing, and the first word's leading space is dropped).
    const { tokens, text_offset: offsets } = c.choices[0].logprobs;
    assert.deepEqual(offsets.slice(0, 2), [0, 0]);
    for (let i = 2; i < tokens.length; ++i) assert.ok(c.choices[0].text.startsWith(tokens[i], offsets[i]), `${i}: ${tokens[i]} at ${offsets[i]}`);
    const bad = await post('/v1/completions', { model, prompt: [[1, 99999]], max_tokens: 1 });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'prompt[0][1]');
    // A batch (lm-eval's batch_size > 1) through the official client: one choice per prompt, in order, each the
    // numbers it gets alone; a bad id in the third prompt is named.
    const batch = await client.completions.create({ model, prompt: [ids, ids.slice(0, ctxlen), ids], max_tokens: 0, echo: true, logprobs: 1 });
    assert.deepEqual(batch.choices.map((ch) => ch.index), [0, 1, 2]);
    assert.deepEqual(batch.choices[0].logprobs.token_logprobs, zero.json.choices[0].logprobs.token_logprobs);
    assert.deepEqual(batch.choices[1].logprobs.token_logprobs, zero.json.choices[0].logprobs.token_logprobs.slice(0, ctxlen));
    assert.equal(batch.usage.prompt_tokens, 2 * ids.length + ctxlen);
    const bad3 = await post('/v1/completions', { model, prompt: [[1], [2], [3, -1]], max_tokens: 1 });
    assert.equal(bad3.status, 400);
    assert.equal(bad3.json.error.param, 'prompt[2][1]');
  });

  test('streaming: chunks add up to the non-streamed answer, usage last', async () => {
    const whole = await client.completions.create({ model, prompt: PROMPT, max_tokens: 40, temperature: 0 });
    const stream = await client.completions.create({
      model, prompt: PROMPT, max_tokens: 40, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let text = '';
    let usage;
    let finish;
    for await (const chunk of stream) {
      if (chunk.choices.length) {
        text += chunk.choices[0].text;
        finish = chunk.choices[0].finish_reason ?? finish;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, whole.choices[0].text);
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 40);

    const chat = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 10, temperature: 0, stream: true,
    });
    const deltas = [];
    for await (const chunk of chat) deltas.push(chunk.choices[0].delta);
    assert.equal(deltas[0].role, 'assistant');
    assert.ok(deltas.length >= 2);
  });

  test('errors come in OpenAI\'s shape', async () => {
    await assert.rejects(client.completions.create({ model: 'gpt-4', prompt: 'x' }), (e) => {
      assert.equal(e.status, 404);
      assert.equal(e.code, 'model_not_found');
      return true;
    });
    await assert.rejects(client.completions.create({ model, prompt: 'x', n: 2 }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'n');
      return true;
    });
    await assert.rejects(client.completions.create({ model, prompt: 'x', temperature: 'hot' }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'temperature');
      return true;
    });
    const long = 'Once upon a time '.repeat(200);
    await assert.rejects(client.completions.create({ model, prompt: long }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.code, 'context_length_exceeded');
      assert.match(e.message, /maximum context length is 512 tokens\. However, your prompt has \d+ tokens/);
      return true;
    });
    await assert.rejects(client.chat.completions.create({ model, messages: [] }), (e) => e.status === 400 && e.param === 'messages');
    // A prompt far too long is refused from its length alone, before tokenizing (fast, little memory).
    const started = Date.now();
    await assert.rejects(client.completions.create({ model, prompt: 'x'.repeat(20 << 20) }), (e) => {
      assert.equal(e.code, 'context_length_exceeded');
      assert.match(e.message, /your prompt has \d+ bytes, more than the \d+ bytes accepted/);
      return true;
    });
    assert.ok(Date.now() - started < 5000, 'a 20 MB prompt took more than 5 s to refuse');
  });

  test('malformed HTTP and JSON get 4xx answers; the server stays up', async () => {
    assert.match(await raw(server.port, 'HELLO\r\n\r\n'), /^HTTP\/1\.1 400/);
    const badJson = await raw(server.port,
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\nConnection: close\r\n\r\n{oops');
    assert.match(badJson, /^HTTP\/1\.1 400/);
    assert.match(badJson, /"type":"invalid_request_error"/);
    assert.match(await raw(server.port, 'GET /v2/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'), /^HTTP\/1\.1 404[\s\S]*"error"/);
    // A Range header does not cut a JSON answer.
    const body = '{"prompt":"Once","max_tokens":2}';
    const ranged = await raw(server.port,
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nRange: bytes=0-20\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
    assert.match(ranged, /^HTTP\/1\.1 200/);
    assert.equal(JSON.parse(ranged.slice(ranged.indexOf('\r\n\r\n') + 4)).usage.completion_tokens, 2);
    // A body shorter than its Content-Length, then the client goes away.
    await raw(server.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt"').catch(() => {});
    const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 3, temperature: 0 });
    assert.equal(r.usage.completion_tokens, 3);
  });

  test('8 concurrent clients x 10 requests: greedy answers equal the same request alone', async () => {
    const prompts = ['Once upon a time', 'The little dog', 'Lily and Tom', 'One day', 'A big red ball', 'The sun', 'Tim had', 'Sue'];
    const greedy = (i) => ({ model, prompt: prompts[i % prompts.length], max_tokens: 16 + (i % 5) * 6, temperature: 0 });
    const alone = [];
    for (let i = 0; i < prompts.length * 5; i++) alone.push((await client.completions.create(greedy(i))).choices[0].text);
    let checked = 0;
    const worker = async (w) => {
      for (let k = 0; k < 10; k++) {
        const i = (w * 10 + k) % alone.length;
        const sampled = (w + k) % 2 === 1;
        const streaming = (w + k) % 3 === 0;
        const request = sampled ? { ...greedy(i), temperature: 0.9, seed: w * 100 + k } : greedy(i);
        let text = '';
        let finish;
        if (streaming) {
          for await (const c of await client.completions.create({ ...request, stream: true })) {
            text += c.choices[0]?.text ?? '';
            finish = c.choices[0]?.finish_reason ?? finish;
          }
        } else {
          const r = await client.completions.create(request);
          text = r.choices[0].text;
          finish = r.choices[0].finish_reason;
          assert.equal(r.usage.prompt_tokens + r.usage.completion_tokens, r.usage.total_tokens);
        }
        assert.ok(finish === 'stop' || finish === 'length', `finish_reason ${finish}`);
        if (!sampled) {
          assert.equal(text, alone[i], `greedy request ${i} differs beside other requests`);
          checked++;
        }
      }
    };
    await Promise.all([0, 1, 2, 3, 4, 5, 6, 7].map(worker));
    assert.ok(checked >= 35, `only ${checked} greedy responses checked`);
  });

  test('a client that disconnects mid-stream frees its slot', async () => {
    // The tiny model writes 400 tokens in a fraction of a second: on a loaded machine the whole stream can be
    // sent before the client's abort reaches the server. So try up to 5 times; a disconnect must cancel at least
    // once, and the slot must be free every time.
    const cancelled = async () => Number((await metrics(server.url)).match(/woq_cancelled_total (\d+)/)[1]);
    const before = await cancelled();
    let text = '';
    for (let attempt = 0; attempt < 5; attempt++) {
      const controller = new AbortController();
      const stream = await client.completions.create(
        { model, prompt: PROMPT, max_tokens: 400, temperature: 0.8, seed: 1, stream: true }, { signal: controller.signal });
      let chunks = 0;
      try {
        for await (const _ of stream) {
          if (++chunks === 1) controller.abort();
        }
      } catch {
        // the client's abort error
      }
      assert.ok(chunks >= 1, `${chunks} chunks`);
      const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 5, temperature: 0 });
      assert.equal(r.usage.completion_tokens, 5);
      for (let i = 0; i < 100; i++) {
        text = await metrics(server.url);
        if (/woq_active_sequences 0\n/.test(text)) break;
        await new Promise((res) => setTimeout(res, 50));
      }
      assert.match(text, /woq_active_sequences 0\n/);
      if ((await cancelled()) > before) break;
    }
    assert.ok((await cancelled()) > before, `no disconnect cancelled its generation in 5 tries:\n${text}`);
    assert.match(text, /woq_time_to_first_token_seconds_count [1-9]/);
  });
});

describe('woq serve --api-key', () => {
  let server;
  before(async () => {
    server = await startServer(['--api-key', 'sekret', '--served-model-name', 'tiny']);
  });
  after(async () => {
    await stop(server);
  });

  test('a missing or wrong key is a 401; the right one works', async () => {
    for (const apiKey of ['wrong', '']) {
      const c = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: apiKey || 'x', maxRetries: 0, defaultHeaders: apiKey ? {} : { Authorization: null } });
      await assert.rejects(c.models.list(), (e) => {
        assert.equal(e.status, 401);
        assert.equal(e.code, 'invalid_api_key');
        return true;
      });
    }
    const c = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'sekret', maxRetries: 0 });
    const r = await c.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 });
    assert.equal(r.model, 'tiny');
    assert.equal(r.usage.completion_tokens <= 4, true);
    assert.equal((await fetch(`${server.url}/health`)).status, 200);  // outside /v1: no key needed
  });
});
