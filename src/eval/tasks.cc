#include "eval/tasks.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/perplexity.h"
#include "io/json_file.h"

namespace woq {

namespace {

std::vector<std::string> lines_of(const std::string& path) {
  const std::string text = read_text_file(path);
  std::vector<std::string> lines;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    begin = end + 1;
  }
  return lines;
}

// One JSONL item: {"query"|"context", "choices", "gold"} or ARC-Challenge's
// {"question", "options": [{"label", "text"}], "answer"}.
McItem jsonl_item(const nlohmann::json& j, const std::string& where, bool question_answer) {
  McItem item;
  try {
    if (j.contains("options")) {
      item.context = "Question: " + j.at("question").get<std::string>() + "\nAnswer:";
      const std::string answer = j.at("answer").get<std::string>();
      item.gold = -1;
      for (const auto& o : j.at("options")) {
        if (o.at("label").get<std::string>() == answer) item.gold = static_cast<int>(item.choices.size());
        item.choices.push_back(o.at("text").get<std::string>());
      }
      if (item.gold < 0) fail("{}: answer '{}' is not one of the option labels", where, answer);
      return item;
    }
    if (!j.contains("context") && !j.contains("query")) fail("{}: needs a \"context\" (or \"query\") string", where);
    item.context = j.contains("context") ? j.at("context").get<std::string>() : j.at("query").get<std::string>();
    if (question_answer) item.context += "\nAnswer:";
    item.choices = j.at("choices").get<std::vector<std::string>>();
    const auto& gold = j.at("gold");
    if (!gold.is_number_integer() || gold.get<std::int64_t>() < 0 || gold.get<std::int64_t>() >= static_cast<std::int64_t>(item.choices.size()))
      fail("{}: \"gold\" is {}, not an index into the {} choices", where, describe_json(gold), item.choices.size());
    item.gold = gold.get<int>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", where, e.what());
  }
  return item;
}

double bootstrap_stderr(const std::vector<int>& hits, std::int64_t resamples, std::uint64_t seed) {
  if (hits.size() < 2 || resamples < 2) return 0.0;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, hits.size() - 1);
  std::vector<double> means;
  for (std::int64_t r = 0; r < resamples; ++r) {
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < hits.size(); ++i) sum += hits[pick(rng)];
    means.push_back(static_cast<double>(sum) / static_cast<double>(hits.size()));
  }
  const double mean = std::accumulate(means.begin(), means.end(), 0.0) / static_cast<double>(means.size());
  double var = 0;
  for (const double m : means) var += (m - mean) * (m - mean);
  return std::sqrt(var / static_cast<double>(means.size() - 1));
}

}  // namespace

McTask load_task(const std::string& name, const std::string& path) {
  McTask task;
  task.name = name;
  const std::vector<std::string> lines = lines_of(path);
  if (name == "hellaswag") {
    task.default_shots = 10;
    // llama.cpp's format: 6 lines per task: context, gold label, 4 endings.
    std::size_t i = 0;
    while (i < lines.size() && !(lines[i].empty() && i + 1 == lines.size())) {
      if (i + 6 > lines.size()) fail("{}:{}: an incomplete task (6 lines each: context, label, 4 endings)", path, i + 1);
      McItem item;
      item.context = lines[i];
      try {
        std::size_t used = 0;
        item.gold = std::stoi(lines[i + 1], &used);
        if (used != lines[i + 1].size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        fail("{}:{}: gold label '{}' is not a number", path, i + 2, lines[i + 1]);
      }
      item.choices.assign(lines.begin() + static_cast<std::ptrdiff_t>(i + 2), lines.begin() + static_cast<std::ptrdiff_t>(i + 6));
      task.items.push_back(std::move(item));
      i += 6;
    }
  } else if (name == "arc_easy" || name == "arc_challenge" || name == "piqa" || name == "jsonl") {
    task.default_shots = name == "arc_challenge" ? 25 : 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].find_first_not_of(" \t") == std::string::npos) continue;
      const std::string where = fmt::format("{}:{}", path, i + 1);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(lines[i]);
      } catch (const nlohmann::json::exception& e) {
        fail("{}: malformed JSON: {}", where, e.what());
      }
      if (!j.is_object()) fail("{}: expected a JSON object", where);
      task.items.push_back(jsonl_item(j, where, name != "jsonl"));
    }
  } else {
    fail("unknown task '{}' (available: arc_easy, arc_challenge, hellaswag, piqa, jsonl)", name);
  }
  if (task.items.empty()) fail("{}: no items", path);
  for (std::size_t i = 0; i < task.items.size(); ++i) {
    const McItem& it = task.items[i];
    if (it.choices.size() < 2) fail("{}: item {} has {} choices (need at least 2)", path, i + 1, it.choices.size());
    for (const auto& c : it.choices)
      if (c.empty()) fail("{}: item {} has an empty choice", path, i + 1);
    if (it.gold < 0 || it.gold >= static_cast<int>(it.choices.size()))
      fail("{}: item {} has gold {} outside [0, {})", path, i + 1, it.gold, it.choices.size());
  }
  return task;
}

std::string build_prompt(const McTask& task, std::int64_t index, int shots, std::uint64_t seed) {
  const auto n = static_cast<std::int64_t>(task.items.size());
  if (shots > n - 1) fail("{}: {} few-shot examples requested, only {} other items", task.name, shots, n - 1);
  std::string prompt;
  if (shots > 0) {
    std::vector<std::int64_t> pool(static_cast<std::size_t>(n));
    std::iota(pool.begin(), pool.end(), 0);
    pool.erase(pool.begin() + index);
    std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(index));
    for (int s = 0; s < shots; ++s) {  // partial Fisher-Yates: `shots` distinct examples
      std::uniform_int_distribution<std::size_t> pick(static_cast<std::size_t>(s), pool.size() - 1);
      std::swap(pool[static_cast<std::size_t>(s)], pool[pick(rng)]);
      const McItem& ex = task.items[static_cast<std::size_t>(pool[static_cast<std::size_t>(s)])];
      prompt += ex.context + task.target_delimiter + ex.choices[static_cast<std::size_t>(ex.gold)] + task.fewshot_delimiter;
    }
  }
  return prompt + task.items[static_cast<std::size_t>(index)].context;
}

std::vector<double> choice_loglikelihoods(LlamaModel& model, const Tokenizer& tokenizer, const McTask& task,
                                          std::int64_t index, const std::string& prompt) {
  const McItem& item = task.items[static_cast<std::size_t>(index)];
  const std::int64_t vocab = model.config().vocab_size;
  const std::vector<std::int32_t> context = tokenizer.encode(prompt);
  std::vector<double> out;
  std::vector<float> logits;
  for (const std::string& choice : item.choices) {
    const std::vector<std::int32_t> whole = tokenizer.encode(prompt + task.target_delimiter + choice);
    std::vector<std::int32_t> cont(whole.begin() + static_cast<std::ptrdiff_t>(std::min(context.size(), whole.size())),
                                   whole.end());
    if (cont.empty()) fail("{}: item {}: choice '{}' adds no tokens", task.name, index + 1, choice);
    std::vector<std::int32_t> input = context;
    input.insert(input.end(), cont.begin(), cont.end());
    // Keep the last context_limit() + 1 tokens (lm-eval truncates on the left).
    const std::int64_t keep = std::min<std::int64_t>(static_cast<std::int64_t>(input.size()), model.context_limit() + 1);
    if (keep <= static_cast<std::int64_t>(cont.size()))
      fail("{}: item {}: the continuation alone exceeds the context of {}", task.name, index + 1, model.context_limit());
    input.erase(input.begin(), input.end() - keep);
    input.pop_back();  // the last token is only a target
    KVCache cache = model.make_cache(static_cast<std::int64_t>(input.size()));
    model.forward(input, cache, true, logits);
    double ll = 0;
    const std::int64_t first = static_cast<std::int64_t>(input.size()) - static_cast<std::int64_t>(cont.size()) + 1;
    for (std::size_t c = 0; c < cont.size(); ++c) {
      ll -= token_nll(logits.data() + (first - 1 + static_cast<std::int64_t>(c)) * vocab, vocab, cont[c]);
    }
    out.push_back(ll);
  }
  return out;
}

std::pair<int, int> score_item(const McItem& item, const std::vector<double>& ll, const std::string& delimiter) {
  std::size_t best = 0, best_norm = 0;
  double best_norm_value = -INFINITY;
  for (std::size_t c = 0; c < ll.size(); ++c) {
    if (ll[c] > ll[best]) best = c;
    const double norm = ll[c] / static_cast<double>((delimiter + item.choices[c]).size());
    if (norm > best_norm_value) {
      best_norm_value = norm;
      best_norm = c;
    }
  }
  const auto gold = static_cast<std::size_t>(item.gold);
  return {best == gold ? 1 : 0, best_norm == gold ? 1 : 0};
}

TaskResult run_task(LlamaModel& model, const Tokenizer& tokenizer, const McTask& task, const TaskOptions& options,
                    const std::function<void(std::int64_t, std::int64_t)>& progress) {
  TaskResult r;
  r.name = task.name;
  r.shots = options.shots < 0 ? task.default_shots : options.shots;
  const auto n = static_cast<std::int64_t>(task.items.size());
  r.items = options.limit > 0 ? std::min(options.limit, n) : n;
  std::vector<int> acc, acc_norm;
  for (std::int64_t i = 0; i < r.items; ++i) {
    const std::string prompt = build_prompt(task, i, r.shots, options.seed);
    const auto [a, an] = score_item(task.items[static_cast<std::size_t>(i)],
                                    choice_loglikelihoods(model, tokenizer, task, i, prompt), task.target_delimiter);
    acc.push_back(a);
    acc_norm.push_back(an);
    if (progress) progress(i + 1, r.items);
  }
  const double items = static_cast<double>(r.items);
  r.acc = std::accumulate(acc.begin(), acc.end(), 0) / items;
  r.acc_norm = std::accumulate(acc_norm.begin(), acc_norm.end(), 0) / items;
  r.acc_stderr = bootstrap_stderr(acc, options.bootstrap, options.seed);
  r.acc_norm_stderr = bootstrap_stderr(acc_norm, options.bootstrap, options.seed + 1);
  return r;
}

}  // namespace woq
