#include "eval/tasks.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>

#include "core/error.h"
#include "core/ranks.h"
#include "eval/perplexity.h"
#include "generate/generate.h"

namespace woq {

namespace {

double bootstrap_stderr(const std::vector<double>& values, std::int64_t resamples, std::uint64_t seed) {
  if (values.size() < 2 || resamples < 2) return 0.0;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
  std::vector<double> means;
  for (std::int64_t r = 0; r < resamples; ++r) {
    double sum = 0;
    for (std::size_t i = 0; i < values.size(); ++i) sum += values[pick(rng)];
    means.push_back(sum / static_cast<double>(values.size()));
  }
  const double mean = std::accumulate(means.begin(), means.end(), 0.0) / static_cast<double>(means.size());
  double var = 0;
  for (const double m : means) var += (m - mean) * (m - mean);
  return std::sqrt(var / static_cast<double>(means.size() - 1));
}

// lm-eval's _encode_pair: the continuation's tokens are those of
// encode(context + continuation) past the context's own tokens.
std::vector<std::int32_t> continuation_ids(const Tokenizer& tokenizer, const std::vector<std::int32_t>& context_ids,
                                           const std::string& context, const std::string& continuation) {
  const std::vector<std::int32_t> whole = tokenizer.encode(context + continuation);
  std::vector<std::int32_t> cont(whole.begin() + static_cast<std::ptrdiff_t>(std::min(context_ids.size(), whole.size())),
                                 whole.end());
  if (cont.empty()) fail("the continuation '{}' adds no tokens", printable(continuation));
  return cont;
}

// A few-shot example: the item with its gold target.
std::string example_text(const Task& task, const TaskItem& ex) {
  const auto gold = static_cast<std::size_t>(ex.gold);
  switch (task.type) {
    case TaskType::kMultipleInput: return ex.choices[gold] + task.target_delimiter + ex.target;
    case TaskType::kGenerate: return ex.context + task.target_delimiter + ex.target;
    case TaskType::kMultipleChoice: break;
  }
  return ex.context + task.target_delimiter + ex.choices[gold];
}

// Items to run: the first `limit` (of each subject for MMLU), in file order.
std::vector<std::int64_t> selected_items(const Task& task, std::int64_t limit) {
  std::vector<std::int64_t> out;
  std::vector<std::int64_t> taken(task.subjects.size() + 1, 0);
  for (std::size_t i = 0; i < task.items.size(); ++i) {
    auto& n = taken[static_cast<std::size_t>(task.items[i].subject + 1)];
    if (limit > 0 && n >= limit) continue;
    ++n;
    out.push_back(static_cast<std::int64_t>(i));
  }
  return out;
}

// Greedy generation of item `prompt` (cut on the left to leave room for
// max_gen_tokens), until one of the task's stop strings or EOS.
std::string generate_answer(LlamaModel& model, const Tokenizer& tokenizer, const Task& task, const std::string& prompt) {
  std::vector<std::int32_t> ids = tokenizer.encode(prompt);
  const std::int64_t max_new = std::min(task.max_gen_tokens, model.context_limit() - 1);
  const std::int64_t keep = model.context_limit() - max_new;
  if (static_cast<std::int64_t>(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
  GenerateOptions o;
  o.max_new_tokens = max_new;
  o.sampling.temperature = 0;
  o.stop_strings = task.until;
  return generate(model, tokenizer, ids, o, [](std::string_view) {}).text;
}

}  // namespace

const TaskMetric& TaskResult::metric(std::string_view metric) const {
  for (const TaskMetric& m : metrics)
    if (m.name == metric) return m;
  fail("task {} has no metric '{}'", name, metric);
}

std::string fewshot_prefix(const Task& task, std::int64_t index, int shots, std::uint64_t seed) {
  const TaskItem& item = task.items[static_cast<std::size_t>(index)];
  std::string prefix;
  if (item.subject >= 0)
    prefix = fmt::format("The following are multiple choice questions (with answers) about {}.\n\n",
                         task.subjects[static_cast<std::size_t>(item.subject)]);
  if (shots <= 0) return prefix;
  const bool own_items = task.fewshot_split.empty();
  const std::vector<TaskItem>& source = own_items ? task.items : task.fewshot;
  std::vector<std::size_t> pool;
  for (std::size_t i = 0; i < source.size(); ++i)
    if (!(own_items && static_cast<std::int64_t>(i) == index) && source[i].subject == item.subject) pool.push_back(i);
  if (static_cast<std::size_t>(shots) > pool.size())
    fail("{}: {} few-shot examples requested, only {} {}", task.name, shots, pool.size(),
         own_items ? std::string("other items")
                   : item.subject >= 0 ? fmt::format("in the {} split of {}", task.fewshot_split,
                                                     task.subjects[static_cast<std::size_t>(item.subject)])
                                       : fmt::format("in the {} split", task.fewshot_split));
  if (!task.fewshot_first_n) {
    std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(index));
    for (std::size_t s = 0; s < static_cast<std::size_t>(shots); ++s) {  // partial Fisher-Yates
      std::uniform_int_distribution<std::size_t> pick(s, pool.size() - 1);
      std::swap(pool[s], pool[pick(rng)]);
    }
  }
  for (std::size_t s = 0; s < static_cast<std::size_t>(shots); ++s)
    prefix += example_text(task, source[pool[s]]) + task.fewshot_delimiter;
  return prefix;
}

void check_fewshot(const Task& task, const TaskOptions& options) {
  const int shots = options.shots < 0 ? task.default_shots : options.shots;
  if (shots <= 0) return;
  std::vector<bool> checked(task.subjects.size() + 1, false);
  for (const std::int64_t i : selected_items(task, options.limit)) {
    const auto subject = static_cast<std::size_t>(task.items[static_cast<std::size_t>(i)].subject + 1);
    if (checked[subject]) continue;  // every item of a subject has the same number of examples
    checked[subject] = true;
    fewshot_prefix(task, i, shots, options.seed);
  }
}

std::string build_prompt(const Task& task, std::int64_t index, int shots, std::uint64_t seed) {
  return fewshot_prefix(task, index, shots, seed) + task.items[static_cast<std::size_t>(index)].context;
}

double loglikelihood(LlamaModel& model, const Tokenizer& tokenizer, const std::string& context,
                     const std::string& continuation) {
  const std::int64_t vocab = model.config().vocab_size;
  const std::vector<std::int32_t> context_ids = tokenizer.encode(context);
  const std::vector<std::int32_t> cont = continuation_ids(tokenizer, context_ids, context, continuation);
  std::vector<std::int32_t> input = context_ids;
  input.insert(input.end(), cont.begin(), cont.end());
  // Keep the last context_limit() + 1 tokens (lm-eval truncates on the left).
  const std::int64_t keep = std::min<std::int64_t>(static_cast<std::int64_t>(input.size()), model.context_limit() + 1);
  if (keep <= static_cast<std::int64_t>(cont.size()))
    fail("the continuation '{}' alone exceeds the context of {} tokens", printable(continuation), model.context_limit());
  input.erase(input.begin(), input.end() - keep);
  input.pop_back();  // the last token is only a target
  KVCache cache = model.make_cache(static_cast<std::int64_t>(input.size()));
  std::vector<float> logits;
  model.forward(input, cache, true, logits);
  double ll = 0;
  const std::int64_t first = static_cast<std::int64_t>(input.size()) - static_cast<std::int64_t>(cont.size());
  for (std::size_t c = 0; c < cont.size(); ++c)
    ll -= token_nll(logits.data() + (first + static_cast<std::int64_t>(c)) * vocab, vocab, cont[c]);
  return ll;
}

namespace {

// Multiple choice with one context: the context runs once and every choice's
// continuation continues its KV cache (bit-identical to running each choice's
// whole sequence, since every matmul row is independent of the others).
// nullopt when the context plus the longest continuation exceeds the model's
// context, where each choice is cut on the left on its own.
std::optional<std::vector<double>> shared_context_loglikelihoods(LlamaModel& model, const Tokenizer& tokenizer,
                                                                 const std::string& context,
                                                                 const std::vector<std::string>& continuations) {
  const std::vector<std::int32_t> context_ids = tokenizer.encode(context);
  std::vector<std::vector<std::int32_t>> conts;
  std::size_t longest = 0;
  for (const std::string& c : continuations) {
    conts.push_back(continuation_ids(tokenizer, context_ids, context, c));
    longest = std::max(longest, conts.back().size());
  }
  const auto needed = static_cast<std::int64_t>(context_ids.size() + longest - 1);
  if (context_ids.empty() || needed > model.context_limit()) return std::nullopt;
  const std::int64_t vocab = model.config().vocab_size;
  KVCache cache = model.make_cache(needed);
  std::vector<float> last, logits;
  model.forward(context_ids, cache, false, last);  // predicts each continuation's first token
  std::vector<double> out;
  for (const auto& cont : conts) {
    cache.length = static_cast<std::int64_t>(context_ids.size());
    double ll = -token_nll(last.data(), vocab, cont[0]);
    if (cont.size() > 1) {
      model.forward(std::span(cont.data(), cont.size() - 1), cache, true, logits);
      for (std::size_t c = 1; c < cont.size(); ++c)
        ll -= token_nll(logits.data() + static_cast<std::int64_t>(c - 1) * vocab, vocab, cont[c]);
    }
    out.push_back(ll);
  }
  return out;
}

}  // namespace

std::vector<double> choice_loglikelihoods(LlamaModel& model, const Tokenizer& tokenizer, const Task& task,
                                          std::int64_t index, const std::string& prefix) {
  const TaskItem& item = task.items[static_cast<std::size_t>(index)];
  try {
    if (task.type != TaskType::kMultipleInput) {
      std::vector<std::string> continuations;
      for (const std::string& choice : item.choices) continuations.push_back(task.target_delimiter + choice);
      if (auto shared = shared_context_loglikelihoods(model, tokenizer, prefix + item.context, continuations)) return *shared;
    }
    std::vector<double> out;
    for (const std::string& choice : item.choices) {
      if (task.type == TaskType::kMultipleInput)
        out.push_back(loglikelihood(model, tokenizer, prefix + choice, task.target_delimiter + item.target));
      else
        out.push_back(loglikelihood(model, tokenizer, prefix + item.context, task.target_delimiter + choice));
    }
    return out;
  } catch (const Error& e) {
    fail("{}: item {}: {}", task.name, index + 1, e.what());
  }
}

std::pair<int, int> score_item(const TaskItem& item, const std::vector<double>& ll, const std::string& delimiter) {
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

double mc2_score(const std::vector<int>& labels, const std::vector<double>& ll) {
  // Shifted by the largest log-likelihood: the ratio is unchanged and exp cannot underflow to 0/0.
  const double top = *std::max_element(ll.begin(), ll.end());
  double all = 0, truth = 0;
  for (std::size_t c = 0; c < ll.size(); ++c) {
    const double p = std::exp(ll[c] - top);
    all += p;
    if (labels[c] == 1) truth += p;
  }
  return truth / all;
}

std::string gsm8k_extract(std::string_view completion) {
  auto in_class = [](char c) { return (c >= '0' && c <= '9') || c == '.' || c == ','; };
  for (std::size_t at = completion.find("#### "); at != std::string_view::npos; at = completion.find("#### ", at + 1)) {
    std::size_t b = at + 5, e = b;
    if (e < completion.size() && completion[e] == '-') ++e;
    const std::size_t digits = e;
    while (e < completion.size() && in_class(completion[e])) ++e;
    if (e > digits) return std::string(completion.substr(b, e - b));
  }
  return "[invalid]";
}

std::string gsm8k_normalize(std::string_view answer) {
  const std::size_t mark = answer.rfind("#### ");
  if (mark != std::string_view::npos) answer.remove_prefix(mark + 5);
  std::string out;
  for (const char c : answer)
    if (c != ',' && c != '$') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

namespace {

// lm-eval's logged sample of item `index`: its (context, continuation) requests, their log-likelihoods and the item's
// value of each metric (the last of `values`).
TaskSample sample_of(const Task& task, const TaskItem& item, std::int64_t index, const std::string& prefix,
                     const std::vector<double>& ll, const std::vector<std::vector<double>>& values) {
  TaskSample s{index, {}, {}, ll, item.gold, item.labels, {}};
  if (item.subject >= 0) s.subject = task.subjects[static_cast<std::size_t>(item.subject)];
  const bool input = task.type == TaskType::kMultipleInput;
  for (const std::string& choice : item.choices)
    s.arguments.emplace_back(prefix + (input ? choice : item.context), task.target_delimiter + (input ? item.target : choice));
  for (const auto& v : values) s.scores.push_back(v.back());
  return s;
}

}  // namespace

TaskResult run_task(LlamaModel& model, const Tokenizer& tokenizer, const Task& task, const TaskOptions& options,
                    const std::function<void(std::int64_t, std::int64_t)>& progress) {
  TaskResult r;
  r.name = task.name;
  r.primary_metric = task.primary_metric;
  r.shots = options.shots < 0 ? task.default_shots : options.shots;
  const std::vector<std::int64_t> items = selected_items(task, options.limit);
  r.items = static_cast<std::int64_t>(items.size());
  // This rank's share of the items: each one's raw result as doubles, [n, v_1..v_n] (generate: n = 1, the exact
  // match; otherwise each choice's log-likelihood). Gathered in item order, they are what one process computes.
  Ranks& ranks = options.ranks != nullptr ? *options.ranks : one_process();
  const auto [first, last] = share(r.items, ranks.rank(), ranks.size());
  std::vector<double> raw;
  for (std::int64_t n = first; n < last; ++n) {
    const std::int64_t i = items[static_cast<std::size_t>(n)];
    const TaskItem& item = task.items[static_cast<std::size_t>(i)];
    const std::string prefix = fewshot_prefix(task, i, r.shots, options.seed);
    if (task.type == TaskType::kGenerate) {
      const std::string answer = generate_answer(model, tokenizer, task, prefix + item.context);
      raw.insert(raw.end(), {1.0, gsm8k_normalize(gsm8k_extract(answer)) == gsm8k_normalize(item.target) ? 1.0 : 0.0});
    } else {
      const std::vector<double> ll = choice_loglikelihoods(model, tokenizer, task, i, prefix);
      raw.push_back(static_cast<double>(ll.size()));
      raw.insert(raw.end(), ll.begin(), ll.end());
    }
    if (progress) progress(n - first + 1, last - first);
  }
  if (ranks.size() > 1) raw = gather_doubles(ranks, raw);
  // Every item's scores (and samples) from the raw results, on every rank.
  const std::vector<std::string>& names = task.metrics;
  const bool mc2 = names.front() == "mc2";
  std::vector<std::vector<double>> values(names.size());
  std::size_t at = 0;
  for (const std::int64_t i : items) {
    if (at >= raw.size()) fail("{}: the ranks' results end before item {}", task.name, i);
    const auto n = static_cast<std::size_t>(raw[at]);
    if (n < 1 || at + 1 + n > raw.size()) fail("{}: a rank's results for item {} are malformed", task.name, i);
    const std::vector<double> ll(raw.begin() + static_cast<std::ptrdiff_t>(at + 1), raw.begin() + static_cast<std::ptrdiff_t>(at + 1 + n));
    at += 1 + n;
    const TaskItem& item = task.items[static_cast<std::size_t>(i)];
    if (task.type == TaskType::kGenerate) {
      values[0].push_back(ll[0]);
    } else {
      if (mc2) {
        values[0].push_back(mc2_score(item.labels, ll));
      } else {
        const auto [acc, acc_norm] = score_item(item, ll, task.target_delimiter);
        for (std::size_t m = 0; m < names.size(); ++m) values[m].push_back(names[m] == "acc_norm" ? acc_norm : acc);
      }
      if (options.keep_samples)
        r.samples.push_back(sample_of(task, item, i, fewshot_prefix(task, i, r.shots, options.seed), ll, values));
    }
  }
  for (std::size_t m = 0; m < names.size(); ++m) {
    const double sum = std::accumulate(values[m].begin(), values[m].end(), 0.0);
    r.metrics.push_back({names[m], values[m].empty() ? 0.0 : sum / static_cast<double>(values[m].size()),
                         bootstrap_stderr(values[m], options.bootstrap, options.seed + m), values[m]});
  }
  return r;
}

std::string bundled_task_data_dir() { return WOQ_TASK_DATA_DIR; }

std::vector<TaskResult> run_tasks(LlamaModel& model, const Tokenizer& tokenizer, const std::vector<Task>& tasks,
                                  const TaskOptions& options, const std::vector<Progress>& progress) {
  std::vector<TaskResult> results;
  for (std::size_t i = 0; i < tasks.size(); ++i)
    results.push_back(run_task(model, tokenizer, tasks[i], options, i < progress.size() ? progress[i] : nullptr));
  return results;
}

}  // namespace woq
