// lm-eval-style multiple-choice tasks: the acc / acc_norm rules, the
// few-shot prompt format, hand-checked scores, and loaders' errors.
#include "eval/tasks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "eval/perplexity.h"
#include "test_files.h"

namespace woq {
namespace {

TEST(Tasks, AccNormDividesByContinuationBytes) {
  McItem item{"ctx", {"a", "bbbb"}, 1};
  // acc: the larger sum (-2 for "a"); acc_norm: -2 / len(" a") = -1 vs -3 / len(" bbbb") = -0.6.
  EXPECT_EQ(score_item(item, {-2.0, -3.0}, " "), std::make_pair(0, 1));
  item.gold = 0;
  EXPECT_EQ(score_item(item, {-2.0, -3.0}, " "), std::make_pair(1, 0));
  // Bytes, not characters: " é" has 3 bytes (2 characters), " a" has 2.
  McItem utf8{"ctx", {"\xC3\xA9", "a"}, 0};
  EXPECT_EQ(score_item(utf8, {-3.0, -2.9}, " "), std::make_pair(0, 1));  // -1.0 vs -1.45 (by characters: -1.5)
}

TEST(Tasks, FewShotPromptFollowsLmEvalFormat) {
  const McTask task = load_task("arc_easy", WOQ_TEST_DATA "/arc_easy_slice.jsonl");
  ASSERT_EQ(task.items.size(), 40u);
  EXPECT_EQ(task.items[0].context,
            "Question: Which statement best explains why photosynthesis is the foundation of most food webs?\nAnswer:");
  EXPECT_EQ(build_prompt(task, 0, 0, 1), task.items[0].context);
  const std::string prompt = build_prompt(task, 5, 3, 1234);
  EXPECT_EQ(prompt, build_prompt(task, 5, 3, 1234));  // deterministic
  EXPECT_NE(prompt, build_prompt(task, 5, 3, 99));
  // Three "context + ' ' + gold choice" examples joined by "\n\n", then the item's context.
  std::vector<std::string> parts;
  for (std::size_t b = 0, e; b <= prompt.size(); b = e + 2) {
    e = prompt.find("\n\n", b);
    if (e == std::string::npos) e = prompt.size();
    parts.push_back(prompt.substr(b, e - b));
  }
  ASSERT_EQ(parts.size(), 4u) << prompt;
  EXPECT_EQ(parts[3], task.items[5].context);
  std::set<std::size_t> used;
  for (int s = 0; s < 3; ++s) {
    bool found = false;
    for (std::size_t i = 0; i < task.items.size(); ++i) {
      const McItem& it = task.items[i];
      if (parts[static_cast<std::size_t>(s)] == it.context + " " + it.choices[static_cast<std::size_t>(it.gold)]) {
        EXPECT_NE(i, 5u) << "the item is its own example";
        used.insert(i);
        found = true;
      }
    }
    EXPECT_TRUE(found) << parts[static_cast<std::size_t>(s)];
  }
  EXPECT_EQ(used.size(), 3u);
  EXPECT_THROW(build_prompt(task, 0, 40, 1), Error);  // only 39 others
}

// Log-likelihoods recomputed here from full-sequence forwards.
TEST(Tasks, ThreeQuestionScoresMatchDirectComputation) {
  ThreadPool pool(2);
  auto model = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{{LowBit::kFp32, 32, Int4Range::kFull}, std::nullopt}, pool);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const McTask task = load_task("jsonl", WOQ_TEST_DATA "/three_questions.jsonl");
  ASSERT_EQ(task.items.size(), 3u);
  int acc = 0, acc_norm = 0;
  for (std::size_t i = 0; i < task.items.size(); ++i) {
    const McItem& it = task.items[i];
    const auto ctx = tok.encode(it.context);
    std::vector<double> ll, norm;
    for (const auto& choice : it.choices) {
      const auto whole = tok.encode(it.context + " " + choice);
      std::vector<float> logits;
      KVCache cache = model->make_cache(static_cast<std::int64_t>(whole.size()));
      model->forward(whole, cache, true, logits);
      double sum = 0;
      for (std::size_t p = ctx.size(); p < whole.size(); ++p) sum -= token_nll(logits.data() + (p - 1) * 512, 512, whole[p]);
      ll.push_back(sum);
      norm.push_back(sum / static_cast<double>(choice.size() + 1));
    }
    const auto got = choice_loglikelihoods(*model, tok, task, static_cast<std::int64_t>(i), it.context);
    for (std::size_t c = 0; c < ll.size(); ++c) EXPECT_NEAR(got[c], ll[c], 1e-4) << i << "," << c;
    acc += std::max_element(ll.begin(), ll.end()) - ll.begin() == it.gold;
    acc_norm += std::max_element(norm.begin(), norm.end()) - norm.begin() == it.gold;
  }
  TaskOptions o;
  o.shots = 0;
  const TaskResult r = run_task(*model, tok, task, o);
  EXPECT_EQ(r.items, 3);
  EXPECT_DOUBLE_EQ(r.acc, acc / 3.0);
  EXPECT_DOUBLE_EQ(r.acc_norm, acc_norm / 3.0);
  EXPECT_GT(r.acc_stderr, 0.0);
}

TEST(Tasks, LoadersReadEachFormatAndNameBadLines) {
  test::TempDir tmp;
  test::write_file(tmp.file("arcc.jsonl"),
                   R"({"question": "Q1?", "options": [{"label": "A", "text": "x"}, {"label": "B", "text": "y"}], "answer": "B"})"
                   "\n");
  const McTask arcc = load_task("arc_challenge", tmp.file("arcc.jsonl"));
  EXPECT_EQ(arcc.items[0].context, "Question: Q1?\nAnswer:");
  EXPECT_EQ(arcc.items[0].gold, 1);
  EXPECT_EQ(arcc.default_shots, 25);
  const McTask hs = load_task("hellaswag", WOQ_TEST_DATA "/hellaswag_slice.txt");
  ASSERT_EQ(hs.items.size(), 40u);
  EXPECT_EQ(hs.items[0].context, "Roof shingle removal: A man is sitting on a roof. he");
  EXPECT_EQ(hs.items[0].gold, 3);
  EXPECT_EQ(hs.items[0].choices[3], "starts pulling up roofing on a roof.");
  EXPECT_EQ(hs.default_shots, 10);

  auto error_of = [&](const std::string& name, const std::string& content) {
    test::write_file(tmp.file("bad"), content);
    try {
      load_task(name, tmp.file("bad"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("jsonl", "{\"context\": \"a\", \"choices\": [\"x\", \"y\"], \"gold\": 0}\n{oops\n").find("bad:2: malformed JSON"),
            std::string::npos);
  EXPECT_NE(error_of("jsonl", "{\"context\": \"a\", \"choices\": [\"x\", \"y\"], \"gold\": 2}\n")
                .find("bad:1: \"gold\" is 2, not an index into the 2 choices"),
            std::string::npos);
  EXPECT_NE(error_of("jsonl", "{\"context\": \"a\", \"choices\": [\"x\", \"y\"], \"gold\": 0.5}\n").find("\"gold\" is 0.5"),
            std::string::npos);
  EXPECT_NE(error_of("jsonl", "{\"choices\": [\"x\", \"y\"], \"gold\": 0}\n").find("needs a \"context\""), std::string::npos);
  EXPECT_NE(error_of("jsonl", "{\"context\": \"a\", \"choices\": [\"x\", \"\"], \"gold\": 0}\n").find("item 1 has an empty choice"),
            std::string::npos);
  EXPECT_NE(error_of("jsonl", "{\"context\": \"a\", \"choices\": [\"x\"], \"gold\": 0}\n").find("1 choices"), std::string::npos);
  EXPECT_NE(error_of("jsonl", "{\"context\": 5, \"choices\": [\"x\", \"y\"], \"gold\": 0}\n").find("bad:1"), std::string::npos);
  EXPECT_NE(error_of("hellaswag", "ctx\n1\na\nb\n").find("incomplete task"), std::string::npos);
  EXPECT_NE(error_of("hellaswag", "ctx\nx\na\nb\nc\nd\n").find("gold label 'x' is not a number"), std::string::npos);
  EXPECT_NE(error_of("jsonl", "\n\n").find("no items"), std::string::npos);
  EXPECT_NE(error_of("mmlu", "x").find("unknown task 'mmlu'"), std::string::npos);
}

}  // namespace
}  // namespace woq
