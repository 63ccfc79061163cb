// woq tokenize: text -> token ids, like llama.cpp's llama-tokenize.
#include <cstdio>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "io/json_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace woq::cli {

namespace {

struct TokenizeArgs {
  std::string model_dir;
  std::string prompt;
  std::string file;
  bool no_special = false;
  bool json = false;
  const CLI::Option* prompt_flag = nullptr;
  const CLI::Option* file_flag = nullptr;
};

// A token's text on one line: UTF-8 kept, \n \r \t \\ and other control or
// stray bytes escaped (a byte-level token may hold part of a character).
std::string escaped(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = unicode::utf8_lead_length(c);
    if (c >= 0x80 && n > 1 && i + n <= text.size() && unicode::is_valid_utf8(std::string_view(text).substr(i, n))) {
      out.append(text, i, n);
      i += n;
      continue;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20 || c >= 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
    ++i;
  }
  return out;
}

int run_tokenize(const TokenizeArgs& a) {
  if (a.prompt_flag->count() + a.file_flag->count() != 1) fail("give the text with -p TEXT or -f FILE (one of them)");
  const Tokenizer tok = Tokenizer::load(a.model_dir);
  const std::string text = a.file_flag->count() > 0 ? read_text_file(a.file) : a.prompt;
  const std::vector<std::int32_t> ids = tok.encode(text, !a.no_special);
  if (a.json) {
    fmt::print("{}\n", nlohmann::json(ids).dump());
  } else {
    std::string out;
    for (const std::int32_t id : ids) out += fmt::format("{}\t{}\n", id, escaped(tok.token_text(id)));
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  fmt::print(stderr, "woq: {} token{} ({} bytes of text; {})\n", ids.size(), ids.size() == 1 ? "" : "s", text.size(),
             tok.describe());
  return 0;
}

}  // namespace

Run add_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text (one 'id<TAB>piece' per line, or --json)");
  cmd->add_option("-m,--model", args->model_dir,
                  "Model directory, a directory with only tokenizer files (tokenizer.json, tokenizer.model, or "
                  "vocab.json + merges.txt; tokenizer_config.json), or a .gguf file (its embedded vocabulary)")
      ->required();
  args->prompt_flag = cmd->add_option("-p,--prompt", args->prompt, "Text to tokenize");
  args->file_flag = cmd->add_option("-f,--file", args->file, "File whose contents to tokenize");
  cmd->add_flag("--no-special", args->no_special,
                "Do not add the post-processor's special tokens (BOS/EOS); special-token text is still matched");
  cmd->add_flag("--json", args->json, "Print only the JSON array of ids");
  return [args] { return run_tokenize(*args); };
}

}  // namespace woq::cli
