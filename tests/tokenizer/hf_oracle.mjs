// Encodes and decodes texts with Hugging Face's own JavaScript tokenizers
// (@huggingface/tokenizers, pinned in package-lock.json), the independent
// implementation woq's tokenizer tests compare against.
//   node hf_oracle.mjs CASES.json OUT.json
// CASES.json: [{"dir": TOKENIZER_DIR, "texts": [...]}]; OUT.json: per case and
// text {"ids", "plain_ids", "text"}: ids with the post-processor's special
// tokens, without them, and the decoded ids (special tokens skipped).
// Exit 77 when the package is not installed (the test is then skipped).
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";

let Tokenizer;
try {
  ({ Tokenizer } = await import("@huggingface/tokenizers"));
} catch {
  process.exit(77);
}

const [casesPath, outPath] = process.argv.slice(2);
const cases = JSON.parse(readFileSync(casesPath, "utf8"));
const out = [];
for (const c of cases) {
  const json = JSON.parse(readFileSync(join(c.dir, "tokenizer.json"), "utf8"));
  const configPath = join(c.dir, "tokenizer_config.json");
  const config = existsSync(configPath) ? JSON.parse(readFileSync(configPath, "utf8")) : {};
  const tok = new Tokenizer(json, config);
  out.push(
    c.texts.map((text) => {
      const ids = tok.encode(text).ids;
      const plain = tok.encode(text, { add_special_tokens: false }).ids;
      const decoded = ids.length ? tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }) : "";
      return { ids, plain_ids: plain, text: decoded };
    }),
  );
}
writeFileSync(outPath, JSON.stringify(out));
