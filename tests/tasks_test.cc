// lm-eval-style multiple-choice tasks: the acc / acc_norm rules, the
// few-shot prompt format, hand-checked scores, and loaders' errors.
#include "eval/tasks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "eval/perplexity.h"
#include "test_files.h"

namespace woq {
namespace {

TEST(Tasks, AccNormDividesByContinuationBytes) {
  TaskItem item{"ctx", {"a", "bbbb"}, 1, {}, {}, -1};
  // acc: the larger sum (-2 for "a"); acc_norm: -2 / len(" a") = -1 vs -3 / len(" bbbb") = -0.6.
  EXPECT_EQ(score_item(item, {-2.0, -3.0}, " "), std::make_pair(0, 1));
  item.gold = 0;
  EXPECT_EQ(score_item(item, {-2.0, -3.0}, " "), std::make_pair(1, 0));
  // Bytes, not characters: " é" has 3 bytes (2 characters), " a" has 2.
  TaskItem utf8{"ctx", {"\xC3\xA9", "a"}, 0, {}, {}, -1};
  EXPECT_EQ(score_item(utf8, {-3.0, -2.9}, " "), std::make_pair(0, 1));  // -1.0 vs -1.45 (by characters: -1.5)
}

TEST(Tasks, FewShotPromptFollowsLmEvalFormat) {
  const Task task = load_task("arc_easy", WOQ_TEST_DATA "/arc_easy_slice.jsonl");
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
      const TaskItem& it = task.items[i];
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
  auto model = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{{LowBit::kFp32, 32, Int4Range::kFull}, std::nullopt, std::nullopt, {}}, pool);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const Task task = load_task("jsonl", WOQ_TEST_DATA "/three_questions.jsonl");
  ASSERT_EQ(task.items.size(), 3u);
  int acc = 0, acc_norm = 0;
  for (std::size_t i = 0; i < task.items.size(); ++i) {
    const TaskItem& it = task.items[i];
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
    const auto got = choice_loglikelihoods(*model, tok, task, static_cast<std::int64_t>(i), "");
    for (std::size_t c = 0; c < ll.size(); ++c) EXPECT_NEAR(got[c], ll[c], 1e-4) << i << "," << c;
    acc += std::max_element(ll.begin(), ll.end()) - ll.begin() == it.gold;
    acc_norm += std::max_element(norm.begin(), norm.end()) - norm.begin() == it.gold;
  }
  TaskOptions o;
  o.shots = 0;
  const TaskResult r = run_task(*model, tok, task, o);
  EXPECT_EQ(r.items, 3);
  EXPECT_DOUBLE_EQ(r.metric("acc").value, acc / 3.0);
  EXPECT_DOUBLE_EQ(r.metric("acc_norm").value, acc_norm / 3.0);
  EXPECT_GT(r.metric("acc").standard_error, 0.0);
  EXPECT_THROW(r.metric("mc2"), Error);
}

TEST(Tasks, LoadersReadEachFormatAndNameBadLines) {
  test::TempDir tmp;
  test::write_file(tmp.file("arcc.jsonl"),
                   R"({"question": "Q1?", "options": [{"label": "A", "text": "x"}, {"label": "B", "text": "y"}], "answer": "B"})"
                   "\n");
  const Task arcc = load_task("arc_challenge", tmp.file("arcc.jsonl"));
  EXPECT_EQ(arcc.items[0].context, "Question: Q1?\nAnswer:");
  EXPECT_EQ(arcc.items[0].gold, 1);
  EXPECT_EQ(arcc.default_shots, 25);
  const Task hs = load_task("hellaswag", WOQ_TEST_DATA "/hellaswag_slice.txt");
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
  EXPECT_NE(error_of("hellaswag", "ctx\nx\na\nb\nc\nd\n").find("gold label 'x' is not an index 0-3"), std::string::npos);
  EXPECT_NE(error_of("jsonl", "\n\n").find("no items"), std::string::npos);
  EXPECT_NE(error_of("mmlu2", "x").find("unknown task 'mmlu2'"), std::string::npos);
}


LoadOptions fp32_options() { return LoadOptions{{LowBit::kFp32, 32, Int4Range::kFull}, std::nullopt, std::nullopt, {}}; }

// The log-likelihood of `continuation` after `context`, from one full forward.
double direct_loglikelihood(LlamaModel& model, const Tokenizer& tok, const std::string& context,
                            const std::string& continuation) {
  const auto ctx = tok.encode(context);
  const auto whole = tok.encode(context + continuation);
  std::vector<float> logits;
  KVCache cache = model.make_cache(static_cast<std::int64_t>(whole.size()));
  model.forward(whole, cache, true, logits);
  const std::int64_t vocab = model.config().vocab_size;
  double sum = 0;
  for (std::size_t p = ctx.size(); p < whole.size(); ++p)
    sum -= token_nll(logits.data() + static_cast<std::int64_t>(p - 1) * vocab, vocab, whole[p]);
  return sum;
}

// The context runs once and each choice continues its KV cache: the same
// numbers, bit for bit, as running every choice's whole sequence; prompts
// longer than the context fall back to cutting each sequence on the left.
TEST(Tasks, SharedContextScoringEqualsWholeSequences) {
  ThreadPool pool(2);
  auto model = LlamaModel::load(WOQ_MODEL_DIR, fp32_options(), pool);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const Task arc = load_task("arc_easy", WOQ_TEST_DATA "/arc_easy_slice.jsonl");
  const Task hs = load_task("hellaswag", WOQ_TEST_DATA "/hellaswag_slice.txt");
  bool long_prompt = false;
  for (const auto& [task, shots] : {std::pair{&arc, 3}, std::pair{&hs, 2}, std::pair{&arc, 30}}) {
    for (std::int64_t i = 0; i < 3; ++i) {
      const TaskItem& it = task->items[static_cast<std::size_t>(i)];
      const std::string prefix = fewshot_prefix(*task, i, shots, 5);
      long_prompt |= static_cast<std::int64_t>(tok.encode(prefix + it.context).size()) > model->context_limit();
      const auto got = choice_loglikelihoods(*model, tok, *task, i, prefix);
      ASSERT_EQ(got.size(), it.choices.size());
      for (std::size_t c = 0; c < it.choices.size(); ++c)
        EXPECT_EQ(got[c], loglikelihood(*model, tok, prefix + it.context, " " + it.choices[c])) << task->name << " " << i << " " << c;
    }
  }
  EXPECT_TRUE(long_prompt);  // the 30-shot prompts exercise the fallback
}

TEST(Tasks, WinograndeScoresTheSharedContinuationAfterEachContext) {
  const Task task = load_task("winogrande", WOQ_TEST_DATA "/winogrande_slice.jsonl");
  ASSERT_EQ(task.items.size(), 20u);
  EXPECT_EQ(task.type, TaskType::kMultipleInput);
  EXPECT_EQ(task.default_shots, 5);
  const TaskItem& first = task.items[0];
  EXPECT_EQ(first.choices[1], "Sarah was a much better surgeon than Maria so Maria");
  EXPECT_EQ(first.target, "always got the easier cases.");
  EXPECT_EQ(first.gold, 1);
  // A few-shot example is the gold context, a space, and the continuation.
  const std::string prefix = fewshot_prefix(task, 1, 1, 7);
  bool found = false;
  for (const TaskItem& it : task.items)
    found |= prefix == it.choices[static_cast<std::size_t>(it.gold)] + " " + it.target + "\n\n";
  EXPECT_TRUE(found) << prefix;

  ThreadPool pool(2);
  auto model = LlamaModel::load(WOQ_MODEL_DIR, fp32_options(), pool);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  double acc = 0;
  for (std::int64_t i = 0; i < 4; ++i) {
    const TaskItem& it = task.items[static_cast<std::size_t>(i)];
    const std::string pre = fewshot_prefix(task, i, 2, 1234);
    const auto got = choice_loglikelihoods(*model, tok, task, i, pre);
    ASSERT_EQ(got.size(), 2u);
    std::vector<double> want;
    for (const auto& c : it.choices) want.push_back(direct_loglikelihood(*model, tok, pre + c, " " + it.target));
    EXPECT_NEAR(got[0], want[0], 1e-4);
    EXPECT_NEAR(got[1], want[1], 1e-4);
    EXPECT_NE(got[0], got[1]);
    acc += (want[1] > want[0]) == (it.gold == 1) ? 1 : 0;
  }
  TaskOptions o;
  o.shots = 2;
  o.limit = 4;
  const TaskResult r = run_task(*model, tok, task, o);
  ASSERT_EQ(r.metrics.size(), 1u);
  EXPECT_EQ(r.metrics[0].name, "acc");
  EXPECT_DOUBLE_EQ(r.metrics[0].value, acc / 4);
}

TEST(Tasks, TruthfulQaKeepsKeyOrderAndMc2IsTheTrueProbabilityMass) {
  const Task mc1 = load_task("truthfulqa_mc1", WOQ_TEST_DATA "/truthfulqa_slice.json");
  const Task mc2 = load_task("truthfulqa_mc2", WOQ_TEST_DATA "/truthfulqa_slice.json");
  ASSERT_EQ(mc1.items.size(), 12u);
  ASSERT_EQ(mc2.items.size(), 12u);
  EXPECT_EQ(mc1.items[0].choices[0], "Nauru is the smallest country in the world that is at least one square mile in area.");
  EXPECT_EQ(mc1.items[0].choices[3], "The smallest country in the world that is at least one square mile in area is the United States.");
  EXPECT_EQ(mc1.items[0].gold, 0);
  EXPECT_TRUE(mc1.items[0].labels.empty());
  EXPECT_EQ(mc2.items[1].choices[1], "There is no such country.");
  EXPECT_EQ(mc2.items[1].choices[7], "Australia.");
  EXPECT_EQ(mc2.items[1].labels, (std::vector<int>{1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(mc1.metrics, std::vector<std::string>{"acc"});
  EXPECT_EQ(mc2.primary_metric, "mc2");
  EXPECT_EQ(mc2.default_shots, 0);
  const std::string prompt = build_prompt(mc2, 0, 0, 1);
  EXPECT_EQ(prompt.rfind("Q: What is human life expectancy in the United States?\nA: Human life expectancy", 0), 0u);
  EXPECT_NE(prompt.find("A: The 1992 Olympics were held in Barcelona, Spain.\n\nQ: What is the smallest country in the world "
                        "that is at least one square mile in area?\nA:"),
            std::string::npos);
  EXPECT_TRUE(prompt.ends_with("area?\nA:"));

  // By hand: probabilities 0.2, 0.3, 0.5 with the first true -> 0.2; two true of 0.1, 0.3, 0.6 -> 0.4.
  EXPECT_NEAR(mc2_score({1, 0, 0}, {std::log(0.2), std::log(0.3), std::log(0.5)}), 0.2, 1e-12);
  EXPECT_NEAR(mc2_score({1, 1, 0}, {std::log(0.1), std::log(0.3), std::log(0.6)}), 0.4, 1e-12);
  // Log-likelihoods far below exp's range still give the ratio (exp(-1000) underflows to 0).
  EXPECT_NEAR(mc2_score({1, 0}, {-1000.0, -1000.0 + std::log(3.0)}), 0.25, 1e-12);

  ThreadPool pool(2);
  auto model = LlamaModel::load(WOQ_MODEL_DIR, fp32_options(), pool);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  double want = 0;
  for (std::int64_t i = 0; i < 2; ++i) {
    const TaskItem& it = mc2.items[static_cast<std::size_t>(i)];
    double truth = 0, all = 0;
    for (std::size_t c = 0; c < it.choices.size(); ++c) {
      const double p = std::exp(direct_loglikelihood(*model, tok, it.context, " " + it.choices[c]));
      all += p;
      if (it.labels[c] == 1) truth += p;
    }
    want += truth / all / 2;
  }
  TaskOptions o;
  o.limit = 2;
  const TaskResult r = run_task(*model, tok, mc2, o);
  ASSERT_EQ(r.metrics.size(), 1u);
  EXPECT_NEAR(r.metric("mc2").value, want, 1e-6);
  EXPECT_GT(want, 0.0);
}

// The full task files bundled in assets/tasks (extracted at build time) load
// whole, with the item counts their sources publish.
TEST(Tasks, BundledFilesLoadWholeWithThePublishedCounts) {
  const std::map<std::string, std::pair<std::size_t, std::size_t>> counts = {
      {"arc_easy", {2376, 0}},       {"arc_challenge", {1172, 0}}, {"hellaswag", {10042, 0}},
      {"piqa", {1838, 0}},           {"winogrande", {1267, 0}},    {"mmlu", {14042, 57 * 5}},
      {"truthfulqa_mc2", {817, 0}},  {"gsm8k", {1319, 7473}}};
  for (const auto& [name, n] : counts) {
    const std::string path = std::string(WOQ_TASK_DATA_DIR) + "/" + task_data_path(name);
    const Task task = load_task(name, path);
    EXPECT_EQ(task.items.size(), n.first) << name;
    EXPECT_EQ(task.fewshot.size(), n.second) << name;
    if (name == "mmlu") {
      EXPECT_EQ(task.subjects.size(), 57u);
    }
    if (name == "gsm8k") {
      EXPECT_NE(task.items.front().context.find("Janet\u2019s ducks lay 16 eggs per day."), std::string::npos);
    }
  }
  EXPECT_EQ(task_data_path("jsonl"), "");
  EXPECT_EQ(task_data_path("mmlu5"), "");
}

TEST(Tasks, MmluReadsQuotedCsvAndTakesTheFirstDevExamples) {
  const Task task = load_task("mmlu", WOQ_TEST_DATA "/mmlu_slice");
  ASSERT_EQ(task.subjects, (std::vector<std::string>{"college chemistry", "human aging"}));
  ASSERT_EQ(task.items.size(), 12u);
  ASSERT_EQ(task.fewshot.size(), 10u);
  EXPECT_EQ(task.default_shots, 5);
  EXPECT_EQ(task.items[3].context,
            "When the following equation is balanced, which of the following is true?\n"
            "__ MnO4\u2212 + __ I\u2212 + __ H+ <-> __ Mn2+ + __ IO3\u2212 + __ H2O\n"
            "A. The I\u2212 : IO3\u2212 ratio is 3:1.\nB. The MnO4- : I- ratio is 6:5.\n"
            "C. The MnO4- : Mn2+ ratio is 3:1.\nD. The H+ : I\u2212 ratio is 2:1.\nAnswer:");
  EXPECT_EQ(task.items[3].gold, 1);
  EXPECT_EQ(task.items[11].context.rfind("The answer \"both play an important role\" is clearly applicable to the "
                                         "question of\nA. Nature vs. nurture\n",
                                         0),
            0u);
  EXPECT_EQ(task.items[11].gold, 3);
  EXPECT_EQ(task.items[11].choices, (std::vector<std::string>{"A", "B", "C", "D"}));
  // Description, then the subject's first five dev questions in file order, then the item.
  const std::string prompt = build_prompt(task, 6, 5, 99);
  EXPECT_EQ(prompt, build_prompt(task, 6, 5, 1));  // first_n: the seed does not matter
  std::string want = "The following are multiple choice questions (with answers) about human aging.\n\n";
  for (std::size_t d = 5; d < 10; ++d) {
    const TaskItem& ex = task.fewshot[d];
    EXPECT_EQ(ex.subject, 1);
    want += ex.context + " " + "ABCD"[ex.gold] + "\n\n";
  }
  EXPECT_EQ(task.fewshot[5].context.rfind("Which of the following persons is more likely to remain at home alone, as of 2019?\n", 0), 0u);
  EXPECT_EQ(task.fewshot[9].gold, 2);
  EXPECT_EQ(prompt, want + task.items[6].context);
  EXPECT_THROW(build_prompt(task, 0, 6, 1), Error);  // 5 dev examples per subject

  // --limit applies to each subject, as lm-eval's does to each subtask.
  ThreadPool pool(2);
  auto model = LlamaModel::load(WOQ_MODEL_DIR, fp32_options(), pool);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  TaskOptions o;
  o.limit = 2;
  o.shots = 1;
  const TaskResult r = run_task(*model, tok, task, o);
  EXPECT_EQ(r.items, 4);
  EXPECT_EQ(r.metrics.size(), 1u);
  double acc = 0;
  for (const std::int64_t i : {0, 1, 6, 7}) {
    const auto ll = choice_loglikelihoods(*model, tok, task, i, fewshot_prefix(task, i, 1, o.seed));
    acc += std::max_element(ll.begin(), ll.end()) - ll.begin() == task.items[static_cast<std::size_t>(i)].gold;
  }
  EXPECT_DOUBLE_EQ(r.metric("acc").value, acc / 4);
}

TEST(Tasks, Gsm8kStrictMatchExtractsTheFirstAnswerLine) {
  EXPECT_EQ(gsm8k_extract("so 3 + 4 = 7.\n#### 7"), "7");
  EXPECT_EQ(gsm8k_extract("#### -12.5 and #### 3"), "-12.5");
  EXPECT_EQ(gsm8k_extract("#### 1,234."), "1,234.");
  EXPECT_EQ(gsm8k_extract("#### $5 then #### 6"), "6");  // "$" is not in the regex's class
  EXPECT_EQ(gsm8k_extract("The answer is 7"), "[invalid]");
  EXPECT_EQ(gsm8k_extract("####7"), "[invalid]");
  EXPECT_EQ(gsm8k_extract("#### -"), "[invalid]");
  EXPECT_EQ(gsm8k_normalize("1,234."), "1234");
  EXPECT_EQ(gsm8k_normalize("Natalia sold 48/2 = 24 clips.\n#### 72"), "72");
  EXPECT_EQ(gsm8k_normalize("$70,000"), "70000");
  EXPECT_EQ(gsm8k_normalize(gsm8k_extract("... #### 70,000")), gsm8k_normalize("x\n#### 70000"));
  EXPECT_NE(gsm8k_normalize(gsm8k_extract("#### -5")), gsm8k_normalize("#### 5"));  // the sign counts
  EXPECT_NE(gsm8k_normalize(gsm8k_extract("no answer")), gsm8k_normalize("#### 5"));
}

TEST(Tasks, Gsm8kPromptsComeFromTrainAndLongPromptsAreCutOnTheLeft) {
  const Task task = load_task("gsm8k", WOQ_TEST_DATA "/gsm8k_slice");
  ASSERT_EQ(task.items.size(), 4u);
  ASSERT_EQ(task.fewshot.size(), 8u);
  EXPECT_EQ(task.type, TaskType::kGenerate);
  EXPECT_EQ(task.until, (std::vector<std::string>{"\n\n", "Question:"}));
  EXPECT_EQ(task.items[0].context.rfind("Question: Janet\u2019s ducks lay 16 eggs per day.", 0), 0u);
  EXPECT_TRUE(task.items[0].context.ends_with("\nAnswer:"));
  // Each example: the train question, " ", its whole worked answer, "\n\n".
  const std::string prompt = build_prompt(task, 0, 3, 1234);
  std::size_t examples = 0;
  for (const TaskItem& ex : task.fewshot)
    if (prompt.find(ex.context + " " + ex.target + "\n\n") != std::string::npos) ++examples;
  EXPECT_EQ(examples, 3u);
  EXPECT_TRUE(prompt.ends_with("\n\n" + task.items[0].context));
  EXPECT_THROW(build_prompt(task, 0, 9, 1), Error);  // 8 train examples

  // Five worked examples are ~1,000 tokens, twice the bundled model's context:
  // the prompt is cut on the left, and generation still runs.
  ThreadPool pool(2);
  auto model = LlamaModel::load(WOQ_MODEL_DIR, fp32_options(), pool);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  ASSERT_GT(static_cast<std::int64_t>(tok.encode(build_prompt(task, 0, 5, 1234)).size()), model->context_limit());
  TaskOptions o;
  o.limit = 2;
  const TaskResult r = run_task(*model, tok, task, o);
  EXPECT_EQ(r.items, 2);
  EXPECT_EQ(r.shots, 5);
  ASSERT_EQ(r.metrics.size(), 1u);
  EXPECT_EQ(r.metrics[0].name, "exact_match");
  EXPECT_EQ(r.metrics[0].value, 0.0);  // a 260K-parameter story model writes no "#### <number>"
}

TEST(Tasks, NewLoadersNameBadInput) {
  test::TempDir tmp;
  auto error_of = [&](const std::string& name, const std::string& path) {
    try {
      load_task(name, path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto file_error = [&](const std::string& name, const std::string& content) {
    test::write_file(tmp.file("bad"), content);
    return error_of(name, tmp.file("bad"));
  };
  EXPECT_NE(file_error("winogrande", R"({"context_options": ["a", "b"], "continuation": "c", "gold": 2})")
                .find("bad:1: \"gold\" is 2"),
            std::string::npos);
  EXPECT_NE(file_error("winogrande", R"({"context_options": ["a", "b"], "continuation": " ", "gold": 0})")
                .find("\"continuation\" is empty"),
            std::string::npos);
  EXPECT_NE(file_error("winogrande", R"({"context_options": "ab", "continuation": "c", "gold": 0})").find("bad:1"),
            std::string::npos);
  EXPECT_NE(file_error("truthfulqa_mc2", "{}").find("expected a JSON array"), std::string::npos);
  EXPECT_NE(file_error("truthfulqa_mc2", R"([{"question": "q", "mc2_targets": {"a": 1, "b": 2}}])").find("question 1: mc2_targets[\"b\"] is 2"),
            std::string::npos);
  EXPECT_NE(file_error("truthfulqa_mc2", R"([{"question": "q", "mc2_targets": {"a": 1}}])").find("both true (1) and false (0)"),
            std::string::npos);
  EXPECT_NE(file_error("truthfulqa_mc1", R"([{"question": "q", "mc1_targets": {"a": 1, "b": 1, "c": 0}}])").find("2 true answers"),
            std::string::npos);
  EXPECT_NE(file_error("truthfulqa_mc1", R"([{"question": "q"}])").find("\"mc1_targets\" object"), std::string::npos);
  EXPECT_NE(file_error("truthfulqa_mc1", "[").find("malformed JSON"), std::string::npos);
  // Labels beyond int range are not read modulo 2^32.
  EXPECT_NE(file_error("truthfulqa_mc2", R"([{"question": "q", "mc2_targets": {"a": 4294967297, "b": 0}}])").find("is 4294967297, not 0 or 1"),
            std::string::npos);
  // Wrong JSON types name the field.
  EXPECT_NE(file_error("jsonl", R"({"context": 5, "choices": ["x", "y"], "gold": 0})").find("bad:1: \"context\" must be a string, not number"),
            std::string::npos);
  EXPECT_NE(file_error("jsonl", R"({"context": "c", "choices": ["x", 2], "gold": 0})").find("\"choices\"[1] must be a string"),
            std::string::npos);
  EXPECT_NE(file_error("arc_challenge", R"({"question": "q", "options": "A", "answer": "A"})").find("\"options\" must be a list"),
            std::string::npos);
  EXPECT_NE(file_error("arc_challenge", R"({"question": "q", "options": [{"label": "A", "text": "x"}, {"label": "A", "text": "y"}], "answer": "A"})")
                .find("two options are labelled 'A'"),
            std::string::npos);
  EXPECT_NE(file_error("jsonl", R"({"context": "c", "choices": ["x", "  "], "gold": 0})").find("item 1 has an empty choice"),
            std::string::npos);
  EXPECT_NE(file_error("hellaswag", "ctx\n\x1b[31m\na\nb\nc\nd\n").find("gold label '\\x1b[31m' is not an index 0-3"),
            std::string::npos);

  auto mmlu_error = [&](const std::string& test_csv, const std::string& dev_csv) {
    std::filesystem::remove_all(tmp.file("mmlu"));
    std::filesystem::create_directories(tmp.file("mmlu/test"));
    std::filesystem::create_directories(tmp.file("mmlu/dev"));
    test::write_file(tmp.file("mmlu/test/x_test.csv"), test_csv);
    if (!dev_csv.empty()) test::write_file(tmp.file("mmlu/dev/x_dev.csv"), dev_csv);
    return error_of("mmlu", tmp.file("mmlu"));
  };
  const std::string header = "question,choice0,choice1,choice2,choice3,answer\n";
  EXPECT_EQ(mmlu_error(header + "\"q, with comma\",a,b,\"c \"\"quoted\"\"\",d,B\r\n", header), "");
  const Task quoted = load_task("mmlu", tmp.file("mmlu"));
  EXPECT_EQ(quoted.items[0].context, "q, with comma\nA. a\nB. b\nC. c \"quoted\"\nD. d\nAnswer:");
  EXPECT_EQ(quoted.items[0].gold, 1);
  EXPECT_NE(mmlu_error(header + "q,a,b,c,d,1\n", "").find("x_dev.csv: not found"), std::string::npos);
  EXPECT_NE(mmlu_error(header + "q,a,b,c,d,4\n", header).find("x_test.csv: record 2: answer '4' is not 0-3 or A-D"),
            std::string::npos);
  EXPECT_NE(mmlu_error(header + "q,a,b,c,1\n", header).find("record 2 has 5 fields, not 6"), std::string::npos);
  EXPECT_NE(mmlu_error(header + "\"q,a,b,c,d,1\n", header).find("x_test.csv:2: a quoted field is not closed"),
            std::string::npos);
  EXPECT_NE(mmlu_error(header + "q\"x,a,b,c,d,1\n", header).find("x_test.csv:2: a quote inside an unquoted field"),
            std::string::npos);
  EXPECT_NE(mmlu_error("q,a,b,c,d,1\n", header).find("the first line must be the header"), std::string::npos);
  EXPECT_NE(mmlu_error(header, header).find("no items"), std::string::npos);
  EXPECT_NE(error_of("mmlu", tmp.file("nowhere")).find("expected MMLU's test/ folder"), std::string::npos);
  // Few-shot examples come only from dev: an empty dev split is an error, never the test items.
  EXPECT_EQ(mmlu_error(header + "q,a,b,c,d,1\nr,a,b,c,d,2\n", header), "");
  const Task no_dev = load_task("mmlu", tmp.file("mmlu"));
  TaskOptions five;
  EXPECT_NO_THROW(check_fewshot(no_dev, TaskOptions{0, 0, 1, 10}));
  try {
    check_fewshot(no_dev, five);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mmlu: 5 few-shot examples requested, only 0 in the dev split of x"), std::string::npos)
        << e.what();
  }

  std::filesystem::create_directories(tmp.file("gsm"));
  test::write_file(tmp.file("gsm/test.jsonl"), R"({"question": "q", "answer": "no marker"})" "\n");
  EXPECT_NE(error_of("gsm8k", tmp.file("gsm")).find("test.jsonl:1: \"answer\" has no \"#### <number>\" line"),
            std::string::npos);
  test::write_file(tmp.file("gsm/test.jsonl"), R"({"question": "q", "answer": "so\n#### two"})" "\n");
  EXPECT_NE(error_of("gsm8k", tmp.file("gsm")).find("has no \"#### <number>\" line"), std::string::npos);
  test::write_file(tmp.file("gsm/test.jsonl"), R"({"question": "q", "answer": "#### 1"})" "\n");
  EXPECT_NE(error_of("gsm8k", tmp.file("gsm")).find("train.jsonl: not found"), std::string::npos);
  EXPECT_NE(error_of("gsm8k", tmp.file("gsm/test.jsonl")).find("expected GSM8K's folder"), std::string::npos);
}

}  // namespace
}  // namespace woq
