// woq serve with Llama 3 and Qwen3 checkpoints (random weights, real
// tokenizers and chat templates, from `woq make-random`): the chat prompt a
// request becomes must be the one Hugging Face's own JavaScript Jinja and
// tokenizers libraries make of it (@huggingface/jinja, @huggingface/tokenizers,
// pinned in package-lock.json), Qwen3's thinking switch must reach the
// template through chat_template_kwargs, and the stop tokens must be the
// models' (<|eot_id|>, <|im_end|>).
// Run: WOQ_BIN=build/bin/woq node tests/server/chat_models.test.mjs
// Exits 77 (CTest: skipped) when `npm ci` has not been run in tests/server (1 under WOQ_REQUIRE_REFERENCES).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer as startServerFor, stop } from './woq_server.mjs';

let OpenAI, Template, Tokenizer;
try {
  ({ default: OpenAI } = await import('openai'));
  ({ Template } = await import('@huggingface/jinja'));
  ({ Tokenizer } = await import('@huggingface/tokenizers'));
} catch {
  // Under WOQ_REQUIRE_REFERENCES (tools/test.sh, CI) the suite must run: a failure, not a skip.
  const required = !['', '0', undefined].includes(process.env.WOQ_REQUIRE_REFERENCES);
  console.log(`${required ? 'FAIL' : 'SKIP'}: the test packages are not installed (npm ci --prefix tests/server)`);
  process.exit(required ? 1 : 77);
}

const WOQ = process.env.WOQ_BIN;
const work = mkdtempSync(join(tmpdir(), 'woq-chat-'));

function makeRandom(preset) {
  const dir = join(work, preset);
  const r = spawnSync(WOQ, ['make-random', '--preset', preset, '--dtype', 'f16', '-o', dir], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return dir;
}

const startServer = (dir) =>
  startServerFor(WOQ, dir, ['--ctx-size', '256', '--low-bit', 'sym_int8', '--served-model-name', 'woq']);

// What transformers' apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs) gives.
function reference(dir, messages, kwargs = {}) {
  const config = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8'));
  const tok = new Tokenizer(JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')), config);
  const token = (t) => (t && typeof t === 'object' ? t.content : t) ?? '';
  const text = new Template(config.chat_template).render({
    messages, add_generation_prompt: true, bos_token: token(config.bos_token), eos_token: token(config.eos_token), ...kwargs,
  });
  return { text, ids: tok.encode(text, { add_special_tokens: false }).ids, tok };
}

const messages = [
  { role: 'system', content: 'You are a terse assistant.' },
  { role: 'user', content: "What's 2+2? Answer in one word, ünïcödé 🦙 allowed." },
];

for (const { preset, stops } of [
  { preset: 'tiny-llama3', stops: ['<|end_of_text|>', '<|eot_id|>'] },
  { preset: 'tiny-qwen3', stops: ['<|im_end|>', '<|endoftext|>'] },
]) {
  describe(preset, () => {
    let dir, server, client;
    before(async () => {
      dir = makeRandom(preset);
      server = await startServer(dir);
      client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0 });
    });
    after(async () => {
      if (server) assert.equal((await stop(server)).code, 0, server.log());
    });

    test('the chat prompt is the one transformers would build', async () => {
      const want = reference(dir, messages);
      const r = await client.chat.completions.create({ model: 'woq', messages, max_tokens: 4, temperature: 0 });
      assert.equal(r.usage.prompt_tokens, want.ids.length, `rendered prompt:\n${want.text}`);
      assert.equal(r.choices[0].message.role, 'assistant');
      // The tokenizer's own first tokens: Llama 3 starts with <|begin_of_text|> (once), Qwen with <|im_start|>.
      assert.equal(want.ids[0], preset === 'tiny-llama3' ? 128000 : 151644);
    });

    test('generation stops at the model\'s end-of-turn tokens', async () => {
      const r = await fetch(`${server.url}/metrics`).then((x) => x.text());
      assert.match(r, /woq_requests_total/);
      const { tok } = reference(dir, messages);
      // The stop ids the server uses are printed in its startup log.
      for (const s of stops) {
        const id = tok.encode(s, { add_special_tokens: false }).ids;
        assert.equal(id.length, 1, s);
        assert.match(server.log(), new RegExp(`stop tokens[^\\n]*\\b${id[0]}\\b`), `${s} (${id[0]}) is not a stop token:\n${server.log()}`);
      }
    });

    if (preset === 'tiny-qwen3') {
      test('chat_template_kwargs reaches the template (Qwen3 enable_thinking)', async () => {
        const off = reference(dir, messages, { enable_thinking: false });
        const on = reference(dir, messages);
        assert.ok(off.text.endsWith('<think>\n\n</think>\n\n'));
        assert.ok(off.ids.length > on.ids.length);
        const r = await client.chat.completions.create({
          model: 'woq', messages, max_tokens: 2, temperature: 0, chat_template_kwargs: { enable_thinking: false },
        });
        assert.equal(r.usage.prompt_tokens, off.ids.length);
        const bad = await fetch(`${server.url}/v1/chat/completions`, {
          method: 'POST', headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ messages, chat_template_kwargs: { messages: [] } }),
        });
        assert.equal(bad.status, 400);
        assert.match((await bad.json()).error.message, /chat_template_kwargs/);
      });
    }
  });
}

after(() => rmSync(work, { recursive: true, force: true }));
