// The chat-template interpreter: byte-identical to python3-jinja2 (rendering
// as transformers does) on real templates and many message lists, plus
// hand-checked whitespace rules and errors.
#include "jinja/jinja.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string_view>

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
  const std::string python = test::python();
  const std::string cmd = python + " " WOQ_TEST_SOURCE "/reference/render_chat_template.py " + tmp.file("in.json") + " " +
                          tmp.file("out.json") + " 2> " + tmp.file("err");
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77 || code == 127) WOQ_SKIP_WITHOUT_REFERENCE(test::python() << " lacks Jinja2 (bash tools/install-deps.sh)");
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

// The sandbox (jinja.h): what would crash the process, hang it or take its
// memory is a TemplateError naming the construct and the line, reached fast.

// Expects rendering `source` to throw a TemplateError whose message has each of `parts`.
void expect_error(const std::string& source, std::initializer_list<std::string_view> parts,
                  const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  SCOPED_TRACE(source.substr(0, 160));
  std::string what;
  EXPECT_THROW(
      {
        try {
          render(source, context);
        } catch (const TemplateError& e) {
          what = e.what();
          throw;
        }
      },
      TemplateError);
  for (const std::string_view part : parts) EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
}

// `n` levels of `open`, `middle`, then `n` of `close`.
std::string nested(int n, const std::string& open, const std::string& middle, const std::string& close) {
  std::string out;
  for (int i = 0; i < n; ++i) out += open;
  out += middle;
  for (int i = 0; i < n; ++i) out += close;
  return out;
}

TEST(JinjaSandbox, IntegerArithmeticIsCheckedNotUndefined) {
  expect_error("{{ (-9223372036854775807 - 1) // -1 }}", {"line 1: integer overflow in -9223372036854775808 // -1"});
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }}"), "0");  // as Python
  expect_error("a\n{{ 9223372036854775807 + 1 }}", {"line 2: integer overflow in 9223372036854775807 + 1"});
  expect_error("{{ -9223372036854775807 - 2 }}", {"integer overflow in -9223372036854775807 - 2"});
  expect_error("{{ 3037000500 * 3037000500 }}", {"integer overflow in 3037000500 * 3037000500"});
  expect_error("{{ 2 ** 63 }}", {"integer overflow in 2 ** 63"});
  expect_error("{{ 3 ** 9223372036854775807 }}", {"integer overflow in 3 ** 9223372036854775807"});
  expect_error("{{ -(-9223372036854775807 - 1) }}", {"integer overflow in -(-9223372036854775808)"});
  expect_error("{{ (-9223372036854775807 - 1) | abs }}", {"abs: integer overflow"});
  expect_error("{{ 1 // 0 }}", {"line 1: division by zero in 1 // 0"});
  expect_error("{{ 1 % 0 }}", {"division by zero in 1 % 0"});
  expect_error("{{ 1 / 0 }}", {"division by zero in 1 / 0"});
  expect_error("{{ 1.5 // 0.0 }}", {"division by zero in 1.5 // 0.0"});
  expect_error("{{ 0 ** -1 }}", {"division by zero in 0 ** -1"});
  expect_error("{{ (1e300 * 1e300) | int }}", {"int: inf is out of the 64-bit range"});
  // In range, Python's results.
  EXPECT_EQ(render("{{ 7 // -2 }} {{ 7 % -2 }} {{ -7 % 2 }} {{ (-2) ** 63 }} {{ 3 ** 39 }} {{ 2 ** -1 }} {{ 1 ** 9223372036854775807 }} "
                   "{{ 9223372036854775806 + 1 }} {{ (-9223372036854775807 - 1) is divisibleby(-1) }}"),
            "-4 -1 1 -9223372036854775808 4052555153018976267 0.5 1 9223372036854775807 True");
}

TEST(JinjaSandbox, LiteralsOutOfRangeNameTheLiteral) {
  expect_error("\n\n{{ 99999999999999999999999 }}", {"line 3: the integer literal 99999999999999999999999 is out of the 64-bit range"});
  expect_error("{{ 1e999 }}", {"line 1: the float literal 1e999 is out of range"});
  EXPECT_EQ(render("{{ [1, 2].99999999999999999999 }}|{{ [1, 2].1 }}"), "|2");  // no such index
}

TEST(JinjaSandbox, ValuesNestAtMost512Levels) {
  const std::string grow = "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  expect_error(grow + "{{ ns.x }}", {"line 1: a list: the value would be nested deeper than 512 levels"});
  expect_error(grow + "{{ ns.x | tojson }}", {"a list: the value would be nested deeper than 512 levels"});
  expect_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = {'k': ns.x} %}{% endfor %}",
               {"a dict: the value would be nested deeper than 512 levels"});
  // 512 levels print, compare and convert.
  const std::string at_limit = "{% set ns = namespace(x=[]) %}{% for i in range(511) %}{% set ns.x = [ns.x] %}{% endfor %}";
  EXPECT_EQ(render(at_limit + "{{ ns.x }}"), nested(512, "[", "", "]"));
  EXPECT_EQ(render(at_limit + "{{ ns.x | tojson }}|{{ ns.x == ns.x }}|{{ ns.x in ns.x }}"), nested(512, "[", "", "]") + "|True|False");
  // A namespace holding 512 levels is one more: walks over it stop.
  const std::string in_namespace = "{% set ns = namespace(x=1) %}{% for i in range(512) %}{% set ns.x = [ns.x] %}{% endfor %}";
  expect_error(in_namespace + "{{ ns }}", {"{{ }}: the value is nested deeper than 512 levels"});
  expect_error(in_namespace + "{{ ns | tojson }}", {"tojson: the value is nested deeper than 512 levels"});
  expect_error(in_namespace + "{{ ns | string }}", {"string: the value is nested deeper than 512 levels"});
}

TEST(JinjaSandbox, TheInputNestsAtMost512Levels) {
  nlohmann::ordered_json context;
  context["deep"] = nlohmann::ordered_json::parse(nested(20000, "[", "", "]"));  // moved: no deep copy
  expect_error("{{ deep }}", {"input: 'deep' is nested deeper than 512 levels"}, context);
  context["deep"] = nlohmann::ordered_json::parse(nested(513, "[", "", "]"));
  expect_error("{{ 1 }}", {"'deep' is nested deeper than 512 levels"}, context);
  context["deep"] = nlohmann::ordered_json::parse(nested(512, "[", "", "]"));
  EXPECT_EQ(render("{{ deep | tojson }}", context), nested(512, "[", "", "]"));
}

TEST(JinjaSandbox, TemplatesNestAtMost128Levels) {
  expect_error("{{ " + nested(100000, "(", "1", ")") + " }}", {"line 1: the expression is nested deeper than 128 levels"});
  std::string sum = "1", attrs = "x";
  for (int i = 0; i < 100000; ++i) sum += " + 1", attrs += ".a";
  expect_error("{{ " + sum + " }}", {"line 1: the expression is nested deeper than 128 levels"});  // a loop, not a recursion, builds it
  expect_error("{{ " + attrs + " }}", {"the expression is nested deeper than 128 levels"});
  expect_error("x\n" + nested(100000, "{% if true %}", "", "{% endif %}"), {"line 2: 'if': blocks are nested deeper than 128 levels"});
  expect_error(nested(100000, "{% for i in [1] %}", "", "{% endfor %}"), {"'for': blocks are nested deeper than 128 levels"});
  // At the limits.
  std::string sum128 = "1";
  for (int i = 1; i < 128; ++i) sum128 += " + 1";
  EXPECT_EQ(render("{{ " + sum128 + " }}"), "128");
  EXPECT_EQ(render("{{ " + nested(40, "(", "1", ")") + " }}"), "1");
  EXPECT_EQ(render(nested(128, "{% if true %}", "deep", "{% endif %}")), "deep");
  EXPECT_EQ(render(nested(127, "{% for i in [1] %}", "{{ i }}", "{% endfor %}")), "1");
}

TEST(JinjaSandbox, ARenderRunsAtMostFiveMillionSteps) {
  expect_error("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
               {"line 1: for: the template ran more than 5000000 steps"});
}

TEST(JinjaSandbox, StepsCountExpressionNodes) {
  std::string sum = "i";
  for (int i = 0; i < 100; ++i) sum += " + i";
  expect_error("\n{% for i in range(100000) %}{% set x = " + sum + " %}{% endfor %}",
               {"line 2: '+': the template ran more than 5000000 steps"});
}

TEST(JinjaSandbox, StepsCountCopiesOfLongStrings) {  // a step per 64 bytes
  expect_error("{% for i in range(1000000) %}{% set x = big %}{% endfor %}", {"'big': the template ran more than 5000000 steps"},
               {{"big", std::string(1 << 20, 'x')}});
}

TEST(JinjaSandbox, ALongConversationIsFarFromTheLimits) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (int i = 0; i < 30000; ++i) messages.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "message " + std::to_string(i)}});
  const std::string text =
      render("{% for m in messages %}<|{{ m.role }}|>{{ m['content'] | trim }}{% if loop.last %}.{% endif %}{% endfor %}",
             {{"messages", messages}});
  EXPECT_TRUE(text.ends_with("<|assistant|>message 29999.")) << text.substr(text.size() - 100);
}

TEST(JinjaSandbox, StringsAndListsAreAtMost16MiB) {
  auto doubling = [](const std::string& op) {
    return "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s " + op + " ns.s %}{% endfor %}";
  };
  expect_error(doubling("~"), {"line 1: '~': the string would be longer than 16 MiB"});
  expect_error(doubling("+"), {"'+': the string would be longer than 16 MiB"});
  expect_error("{{ 'ab' * 100000000 }}", {"'*': the string would be longer than 16 MiB"});
  expect_error("{{ 100000000 * 'ab' }}", {"'*': the string would be longer than 16 MiB"});
  expect_error("{{ [1, 2] * 100000000 }}", {"'*': the list would have more than 1000000 elements"});
  // A list counts its strings' bytes.
  const nlohmann::ordered_json big = {{"big", std::string(1 << 20, 'x')}};
  expect_error("{% set ns = namespace(l=[big]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
               {"'+': the value would be larger than 16 MiB"}, big);
  expect_error("{{ [big] * 20 }}", {"'*': the value would be larger than 16 MiB"}, big);
  expect_error("{{ range(100) | join(big) }}", {"join: the text would be longer than 16 MiB"}, big);
  expect_error("{{ ('a' * 1000000) | replace('a', 'twenty bytes of text') }}", {"replace: the string would be longer than 16 MiB"});
  expect_error("{{ {'a': 1} | tojson(indent=100000000) }}", {"tojson: the text would be longer than 16 MiB"});
  expect_error("{{ (',' * 2000000).split(',') }}", {"split(): the list would have more than 1000000 elements"});
  // Within them.
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ 3 * 'ab' }} {{ [1] * 3 }} {{ 'x' * -1 }}{{ [1, 2] * 0 }} {{ (big * 16) | length }}", big),
            "ababab ababab [1, 1, 1] [] 16777216");
}

TEST(JinjaSandbox, TheOutputIsAtMost16MiB) {
  const nlohmann::ordered_json big = {{"big", std::string(1 << 20, 'x')}};
  expect_error("{% for i in range(100) %}{{ big }}{% endfor %}", {"line 1: {{ }}: the output would be longer than 16 MiB"}, big);
  expect_error("{% for i in range(20000) %}" + std::string(1000, 't') + "{% endfor %}", {"text: the output would be longer than 16 MiB"});
  expect_error("{% set x %}{% for i in range(100) %}{{ big }}{% endfor %}{% endset %}", {"the output would be longer than 16 MiB"}, big);
  EXPECT_EQ(render("{% for i in range(16) %}{{ big }}{% endfor %}", big).size(), 16u << 20);
}

TEST(JinjaSandbox, RangeIsAtMostAMillionElements) {
  expect_error("{{ range(-9223372036854775807 - 1, 9223372036854775807) }}",
               {"line 1: range() is too long: 18446744073709551615 elements (at most 1000000)"});
  expect_error("{{ range(9223372036854775807, -9223372036854775807 - 1, -1) }}", {"range() is too long"});
  expect_error("{{ range(0, 9223372036854775807, 2) }}", {"range() is too long: 4611686018427387904 elements"});
  expect_error("{{ range(1000001) }}", {"range() is too long: 1000001 elements"});
  EXPECT_EQ(render("{{ range(1000000) | length }} {{ range(5, -5, -3) | list }} "
                   "{{ range(9223372036854775806, 9223372036854775807) | list }} {{ range(-9223372036854775807 - 1, 0, 9223372036854775807) | list }}"),
            "1000000 [5, 2, -1, -4] [9223372036854775806] [-9223372036854775808, -1]");
}

TEST(JinjaSandbox, NamespacesCannotBeNested) {
  expect_error("{% set ns = namespace(a=1) %}{% set ns.self = ns %}", {"line 1: cannot set 'ns.self' to a namespace()"});
  expect_error("{% set ns = namespace() %}{{ [ns] }}", {"a list: a namespace() cannot be put in a list, dict or namespace"});
  expect_error("{% set ns = namespace() %}{{ {'k': ns} }}", {"a dict: a namespace() cannot be put"});
  expect_error("{% set ns = namespace() %}{{ namespace(inner=ns) }}", {"namespace(): a namespace() cannot be put"});
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set alias = ns %}{% set alias.a = 2 %}{{ ns.a }}"), "2");
}

TEST(JinjaSandbox, StringsIndexByCodePointWithoutAnIndex) {
  // Python's results (the slicing, indexing and reversing code walks the bytes).
  EXPECT_EQ(render("{{ 'héllo'[1] }}|{{ 'héllo'[-1] }}|{{ 'héllo'[::-1] }}|{{ 'héllo'[1:3] }}|{{ 'héllo' | first }}|{{ 'héllo' | last }}|"
                   "{{ 'héllo' | reverse }}|{{ 'héllo' | length }}|{{ 'héllo'.find('l') }}|{{ 'a€b😀c' | reverse }}|{{ 'a€b😀c'[1:4] }}|"
                   "{{ 'a€b😀c'[::2] }}|{{ 'a€b😀c'[3:0:-1] }}|{{ 'abc'[1:1] }}|{{ 'abc'[-100:100] }}|{{ 'abc'[5] }}|{{ '' | reverse }}"),
            "é|o|olléh|él|h|o|olléh|5|2|c😀b€a|€b😀|abc|😀b€||abc||");
  EXPECT_EQ(render("{{ [1, 2, 3, 4, 5][::-2] }} {{ [1, 2, 3][1::9223372036854775807] }} {{ [1, 2, 3][::-9223372036854775807 - 1] }} "
                   "{{ [1, 2, 3][-100:-1] }}"),
            "[5, 3, 1] [2] [3] [1, 2]");
}

}  // namespace
}  // namespace woq::jinja
