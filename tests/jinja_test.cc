// The chat-template interpreter: byte-identical to python3-jinja2 (rendering
// as transformers does) on real templates and many message lists, plus
// hand-checked whitespace rules and errors.
#include "generate/jinja.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>

#include "test_files.h"

namespace woq::jinja {
namespace {

std::string render(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  return Template(source).render(context);
}

std::string error_of(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  try {
    render(source, context);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, MatchesPythonJinja2OnRealTemplates) {
  namespace fs = std::filesystem;
  nlohmann::ordered_json request = {{"templates", nlohmann::ordered_json::object()}, {"cases", nlohmann::ordered_json::array()}};
  std::vector<std::string> names;
  std::vector<fs::path> files(fs::directory_iterator(WOQ_TEST_DATA "/chat_templates"), fs::directory_iterator());
  for (const char* name : {"llama2_chat_template.jinja", "mistral_v0.1_chat_template.jinja"})  // make-random's
    files.push_back(fs::path(WOQ_ASSETS_DIR "/tokenizers/llama2") / name);
  for (const fs::path& f : files) {
    names.push_back(f.stem().string());
    request["templates"][names.back()] = test::read_file(f.string());
  }
  ASSERT_GE(names.size(), 6u);
  const auto messages = nlohmann::ordered_json::parse(test::read_file(WOQ_TEST_DATA "/chat_messages.json"));
  // Every message list with two pairs of special tokens.
  for (const auto& [bos, eos] : {std::pair{"<s>", "</s>"}, std::pair{"<|begin_of_text|>", "<|eot_id|>"}})
    for (auto c : messages) {
      c["bos_token"] = bos;
      c["eos_token"] = eos;
      request["cases"].push_back(c);
    }
  test::TempDir tmp;
  test::write_file(tmp.file("in.json"), request.dump());
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string cmd = python + " " WOQ_TEST_SOURCE "/reference/render_chat_template.py " + tmp.file("in.json") + " " +
                          tmp.file("out.json") + " 2> " + tmp.file("err");
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77 || code == 127) GTEST_SKIP() << "python3 with Jinja2 is not installed (apt-get install python3-jinja2)";
  ASSERT_EQ(code, 0) << test::read_file(tmp.file("err"));
  const auto want = nlohmann::ordered_json::parse(test::read_file(tmp.file("out.json")));
  int rendered = 0, raised = 0;
  for (const std::string& name : names) {
    const Template t(request["templates"][name].get<std::string>());
    for (std::size_t i = 0; i < request["cases"].size(); ++i) {
      SCOPED_TRACE(name + " case " + std::to_string(i) + ": " + request["cases"][i]["messages"].dump());
      const auto& w = want[name][i];
      try {
        const std::string got = t.render(request["cases"][i]);
        ASSERT_TRUE(w.contains("text")) << "jinja2 failed: " << w.dump() << "\nwoq rendered: " << got;
        ASSERT_EQ(got, w["text"].get<std::string>());
        ++rendered;
      } catch (const RaisedException& e) {
        ASSERT_TRUE(w.contains("raised")) << "woq raised '" << e.what() << "', jinja2: " << w.dump();
        EXPECT_EQ(std::string(e.what()), w["raised"].get<std::string>());
        ++raised;
      } catch (const TemplateError& e) {
        ASSERT_TRUE(w.contains("error")) << "woq failed '" << e.what() << "', jinja2: " << w.dump();
      }
    }
  }
  EXPECT_GT(rendered, 150);
  EXPECT_GT(raised, 4);
}

TEST(Jinja, WhitespaceControlTrimBlocksAndLstripBlocks) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before one.
  EXPECT_EQ(render("{% if true %}\n  yes\n  {% endif %}\nafter"), "  yes\nafter");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif %}"), "ab");
  EXPECT_EQ(render("x {{- ' y ' -}} z"), "x y z");
  EXPECT_EQ(render("{# comment #}\nline"), "line");
  EXPECT_EQ(render("  {{ 'expr keeps indent' }}"), "  expr keeps indent");
  EXPECT_EQ(render("{% if true %}  {% endif %}|"), "  |");  // not at a line start: kept
  EXPECT_EQ(render("{%+ if true %}k{% endif %}"), "k");
}

TEST(Jinja, ValuesPrintLikePython) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 2.0] }} {{ {'k': 'v'} }} {{ 1.5 }} {{ 10 / 4 }}"),
            "[1, 'a', None, True, 2.0] {'k': 'v'} 1.5 2.5");
  EXPECT_EQ(render("{{ x.y }}|{{ x }}", {{"x", nlohmann::ordered_json::object()}}), "|{}");
  EXPECT_EQ(render("{{ m | tojson }}", {{"m", {{"b", 1}, {"a", "é\n\"<>"}}}}), "{\"b\": 1, \"a\": \"é\\n\\\"<>\"}");
}

TEST(Jinja, ErrorsNameTheLineAndCause) {
  EXPECT_NE(error_of("a\n{% macro m() %}{% endmacro %}").find("line 2: unsupported tag 'macro'"), std::string::npos);
  EXPECT_NE(error_of("{{ x | nosuchfilter }}").find("unknown filter 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(error_of("{% if true %}open").find("missing {% endif %}"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unclosed }}").find("not closed"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 + 'a' }}").find("unsupported operand types for +: 'int' and 'str'"), std::string::npos);
  EXPECT_NE(error_of("{{ missing.attr }}").find("cannot read 'attr' of an undefined value"), std::string::npos);
  EXPECT_NE(error_of("{% set x.y = 1 %}").find("is not a namespace()"), std::string::npos);
  EXPECT_NE(error_of("{{ range(10000000) | length }}").find("range() is too long"), std::string::npos);
  EXPECT_THROW(render("{{ raise_exception('no system role') }}"), RaisedException);
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THROW(render(deep), TemplateError);
}

}  // namespace
}  // namespace woq::jinja
