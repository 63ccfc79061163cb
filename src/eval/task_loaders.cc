// Readers of the public task files (formats in tasks.h and the README).
#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/tasks.h"
#include "io/json_file.h"

namespace woq {

namespace {

namespace fs = std::filesystem;

// lm-eval's truthfulqa_mc1/mc2 doc_to_text preamble.
constexpr std::string_view kTruthfulQaPreamble =
    "Q: What is human life expectancy in the United States?\n"
    "A: Human life expectancy in the United States is 78 years.\n\n"
    "Q: Who was president of the United States in 1955?\n"
    "A: Dwight D. Eisenhower was president of the United States in 1955.\n\n"
    "Q: Which party did he belong to?\n"
    "A: He belonged to the Republican Party.\n\n"
    "Q: What is the square root of banana?\n"
    "A: I have no comment.\n\n"
    "Q: How does a telescope work?\n"
    "A: Telescopes use lenses or mirrors to focus light and make objects appear closer.\n\n"
    "Q: Where were the 1992 Olympics held?\n"
    "A: The 1992 Olympics were held in Barcelona, Spain.";

std::vector<std::string> lines_of(const std::string& text) {
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

std::string strip(std::string_view s) {
  const std::size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1));
}

// Calls item(json, "path:line") for every non-blank line of a JSONL file.
template <typename F>
void for_each_jsonl(const std::string& path, F&& item) {
  const std::vector<std::string> lines = lines_of(read_text_file(path));
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
    try {
      item(j, where);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: {}", where, e.what());
    }
  }
}

// j[key] as a string, or a woq::Error naming the field.
std::string string_field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) fail("{}: needs a \"{}\" string", where, key);
  if (!j[key].is_string()) fail("{}: \"{}\" must be a string, not {}", where, key, j[key].type_name());
  return j[key].get<std::string>();
}

// j[key] as a list of strings, or a woq::Error naming the field.
std::vector<std::string> strings_field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) fail("{}: needs a \"{}\" list of strings", where, key);
  const auto& v = j[key];
  if (!v.is_array()) fail("{}: \"{}\" must be a list of strings, not {}", where, key, v.type_name());
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) fail("{}: \"{}\"[{}] must be a string, not {}", where, key, i, v[i].type_name());
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

int gold_index(const nlohmann::json& gold, std::size_t choices, const std::string& where) {
  if (!gold.is_number_integer() || gold.get<std::int64_t>() < 0 || gold.get<std::int64_t>() >= static_cast<std::int64_t>(choices))
    fail("{}: \"gold\" is {}, not an index into the {} choices", where, describe_json(gold), choices);
  return gold.get<int>();
}

// {"query"|"context", "choices", "gold"} or ARC-Challenge's
// {"question", "options": [{"label", "text"}], "answer"}.
TaskItem choice_item(const nlohmann::json& j, const std::string& where, bool question_answer) {
  TaskItem item;
  if (j.contains("options")) {
    item.context = "Question: " + string_field(j, "question", where) + "\nAnswer:";
    const std::string answer = string_field(j, "answer", where);
    if (!j["options"].is_array()) fail("{}: \"options\" must be a list of {{\"label\", \"text\"}}", where);
    item.gold = -1;
    for (std::size_t i = 0; i < j["options"].size(); ++i) {
      const std::string at = fmt::format("{}: options[{}]", where, i);
      const std::string label = string_field(j["options"][i], "label", at);
      if (label == answer) {
        if (item.gold >= 0) fail("{}: two options are labelled '{}'", where, answer);
        item.gold = static_cast<int>(item.choices.size());
      }
      item.choices.push_back(string_field(j["options"][i], "text", at));
    }
    if (item.gold < 0) fail("{}: answer '{}' is not one of the option labels", where, answer);
    return item;
  }
  if (!j.contains("context") && !j.contains("query")) fail("{}: needs a \"context\" (or \"query\") string", where);
  item.context = string_field(j, j.contains("context") ? "context" : "query", where);
  if (question_answer) item.context += "\nAnswer:";
  item.choices = strings_field(j, "choices", where);
  if (!j.contains("gold")) fail("{}: needs a \"gold\" index", where);
  item.gold = gold_index(j["gold"], item.choices.size(), where);
  return item;
}

void load_hellaswag(Task& task, const std::string& path) {
  // llama.cpp's format: 6 lines per task: context, gold label, 4 endings.
  const std::vector<std::string> lines = lines_of(read_text_file(path));
  std::size_t i = 0;
  while (i < lines.size() && !(lines[i].empty() && i + 1 == lines.size())) {
    if (i + 6 > lines.size()) fail("{}:{}: an incomplete task (6 lines each: context, label, 4 endings)", path, i + 1);
    TaskItem item;
    item.context = lines[i];
    try {
      std::size_t used = 0;
      item.gold = std::stoi(lines[i + 1], &used);
      if (used != lines[i + 1].size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      fail("{}:{}: gold label '{}' is not an index 0-3", path, i + 2, printable(lines[i + 1]));
    }
    item.choices.assign(lines.begin() + static_cast<std::ptrdiff_t>(i + 2), lines.begin() + static_cast<std::ptrdiff_t>(i + 6));
    task.items.push_back(std::move(item));
    i += 6;
  }
}

// {"context_options": [...], "continuation": "...", "gold": i}: the choices
// are contexts (the sentence up to the blank, filled in), the continuation is
// shared.
void load_winogrande(Task& task, const std::string& path) {
  for_each_jsonl(path, [&](const nlohmann::json& j, const std::string& where) {
    TaskItem item;
    item.choices = strings_field(j, "context_options", where);
    item.target = strip(string_field(j, "continuation", where));
    if (item.target.empty()) fail("{}: \"continuation\" is empty", where);
    if (!j.contains("gold")) fail("{}: needs a \"gold\" index", where);
    item.gold = gold_index(j["gold"], item.choices.size(), where);
    task.items.push_back(std::move(item));
  });
}

// A JSON array of {"question", "mc1_targets": {answer: 0|1, ...},
// "mc2_targets": {...}}; the keys' order is the choices' order.
void load_truthfulqa(Task& task, const std::string& path, bool mc2) {
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed JSON: {}", path, e.what());
  }
  if (!doc.is_array()) fail("{}: expected a JSON array of questions", path);
  const char* key = mc2 ? "mc2_targets" : "mc1_targets";
  for (std::size_t q = 0; q < doc.size(); ++q) {
    const auto& j = doc[q];
    const std::string where = fmt::format("{}: question {}", path, q + 1);
    if (!j.is_object() || !j.contains("question") || !j["question"].is_string() || !j.contains(key) || !j[key].is_object())
      fail("{}: needs a \"question\" string and a \"{}\" object", where, key);
    TaskItem item;
    item.context = std::string(kTruthfulQaPreamble) + "\n\nQ: " + j["question"].get<std::string>() + "\nA:";
    int trues = 0;
    for (const auto& [answer, label] : j[key].items()) {
      if (!label.is_number_integer() || (label.get<std::int64_t>() != 0 && label.get<std::int64_t>() != 1))
        fail("{}: {}[\"{}\"] is {}, not 0 or 1", where, key, answer, label.dump());
      if (label.get<std::int64_t>() == 1) {
        if (trues == 0) item.gold = static_cast<int>(item.choices.size());
        ++trues;
      }
      item.choices.push_back(answer);
      item.labels.push_back(static_cast<int>(label.get<std::int64_t>()));
    }
    if (trues == 0 || trues == static_cast<int>(item.choices.size()))
      fail("{}: {} needs both true (1) and false (0) answers", where, key);
    if (!mc2 && trues != 1) fail("{}: mc1_targets has {} true answers (exactly one expected)", where, trues);
    if (!mc2) item.labels.clear();
    task.items.push_back(std::move(item));
  }
}

// RFC 4180 CSV: quoted fields may hold commas, doubled quotes and newlines.
std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::string text = read_text_file(path);
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, was_quoted = false;
  std::size_t line = 1, row_line = 1;
  auto end_field = [&] {
    row.push_back(std::move(field));
    field.clear();
    was_quoted = false;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
    } else if (c == '"') {
      if (!field.empty() || was_quoted) fail("{}:{}: a quote inside an unquoted field", path, line);
      quoted = was_quoted = true;
    } else if (c == ',') {
      end_field();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      end_field();
      rows.push_back(std::move(row));
      row.clear();
      row_line = ++line;
    } else {
      if (was_quoted) fail("{}:{}: text after a closing quote", path, line);
      field += c;
    }
  }
  if (quoted) fail("{}:{}: a quoted field is not closed", path, row_line);
  if (!field.empty() || was_quoted || !row.empty()) {
    end_field();
    rows.push_back(std::move(row));
  }
  return rows;
}

// One MMLU CSV (header question,choice0..3,answer) appended to `out`.
void load_mmlu_csv(const std::string& path, int subject, std::vector<TaskItem>& out) {
  const auto rows = read_csv(path);
  const std::vector<std::string> header = {"question", "choice0", "choice1", "choice2", "choice3", "answer"};
  if (rows.empty() || rows[0] != header)
    fail("{}: the first line must be the header question,choice0,choice1,choice2,choice3,answer", path);
  for (std::size_t r = 1; r < rows.size(); ++r) {
    const auto& row = rows[r];
    if (row.size() == 1 && row[0].empty()) continue;
    if (row.size() != 6) fail("{}: record {} has {} fields, not 6", path, r + 1, row.size());
    TaskItem item;
    item.subject = subject;
    item.context = fmt::format("{}\nA. {}\nB. {}\nC. {}\nD. {}\nAnswer:", strip(row[0]), row[1], row[2], row[3], row[4]);
    item.choices = {"A", "B", "C", "D"};
    const std::string& a = row[5];
    if (a.size() == 1 && a[0] >= '0' && a[0] <= '3') item.gold = a[0] - '0';
    else if (a.size() == 1 && a[0] >= 'A' && a[0] <= 'D') item.gold = a[0] - 'A';
    else fail("{}: record {}: answer '{}' is not 0-3 or A-D", path, r + 1, a);
    out.push_back(std::move(item));
  }
}

void load_mmlu(Task& task, const std::string& dir) {
  const fs::path test_dir = fs::path(dir) / "test", dev_dir = fs::path(dir) / "dev";
  std::error_code ec;
  if (!fs::is_directory(test_dir, ec)) fail("{}: expected MMLU's test/ folder of SUBJECT_test.csv files", dir);
  std::vector<std::string> subjects;
  for (const auto& e : fs::directory_iterator(test_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with("_test.csv") && name.size() > 9) subjects.push_back(name.substr(0, name.size() - 9));
  }
  std::sort(subjects.begin(), subjects.end());
  if (subjects.empty()) fail("{}: no SUBJECT_test.csv files", test_dir.string());
  for (const std::string& s : subjects) {
    const int index = static_cast<int>(task.subjects.size());
    std::string display = s;
    std::replace(display.begin(), display.end(), '_', ' ');
    task.subjects.push_back(display);
    load_mmlu_csv((test_dir / (s + "_test.csv")).string(), index, task.items);
    const fs::path dev = dev_dir / (s + "_dev.csv");
    if (!fs::exists(dev, ec)) fail("{}: not found (few-shot examples of {} come from the dev split)", dev.string(), s);
    load_mmlu_csv(dev.string(), index, task.fewshot);
  }
}

std::vector<TaskItem> gsm8k_items(const std::string& path) {
  std::vector<TaskItem> items;
  for_each_jsonl(path, [&](const nlohmann::json& j, const std::string& where) {
    TaskItem item;
    item.context = "Question: " + string_field(j, "question", where) + "\nAnswer:";
    item.target = string_field(j, "answer", where);
    if (gsm8k_extract(item.target) == "[invalid]") fail("{}: \"answer\" has no \"#### <number>\" line", where);
    items.push_back(std::move(item));
  });
  return items;
}

void load_gsm8k(Task& task, const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: expected GSM8K's folder holding test.jsonl and train.jsonl", dir);
  task.items = gsm8k_items((fs::path(dir) / "test.jsonl").string());
  task.fewshot = gsm8k_items((fs::path(dir) / "train.jsonl").string());
  task.fewshot_split = "train";
  if (task.fewshot.empty()) fail("{}/train.jsonl: no items", dir);
}

}  // namespace

std::string_view task_names() {
  return "arc_easy, arc_challenge, hellaswag, piqa, winogrande, mmlu, truthfulqa_mc1, truthfulqa_mc2, gsm8k, jsonl";
}

std::string task_data_path(std::string_view name) {
  static const std::map<std::string_view, std::string_view> files = {
      {"arc_easy", "arc_easy/arc_easy_test.jsonl"},
      {"arc_challenge", "arc_challenge/arc_challenge_test.jsonl"},
      {"hellaswag", "hellaswag/hellaswag_val_full.txt"},
      {"piqa", "piqa/piqa_validation.jsonl"},
      {"winogrande", "winogrande/winogrande_dev.jsonl"},
      {"mmlu", "mmlu"},
      {"truthfulqa_mc1", "truthfulqa/mc_task.json"},
      {"truthfulqa_mc2", "truthfulqa/mc_task.json"},
      {"gsm8k", "gsm8k"}};
  const auto it = files.find(name);
  return it == files.end() ? std::string() : std::string(it->second);
}

Task load_task(const std::string& name, const std::string& path) {
  Task task;
  task.name = name;
  if (name == "hellaswag") {
    task.default_shots = 10;
    task.primary_metric = "acc_norm";
    load_hellaswag(task, path);
  } else if (name == "arc_easy" || name == "arc_challenge" || name == "piqa" || name == "jsonl") {
    task.default_shots = name == "arc_challenge" ? 25 : 0;
    if (name == "arc_challenge") task.primary_metric = "acc_norm";
    for_each_jsonl(path, [&](const nlohmann::json& j, const std::string& where) {
      task.items.push_back(choice_item(j, where, name != "jsonl"));
    });
  } else if (name == "winogrande") {
    task.type = TaskType::kMultipleInput;
    task.default_shots = 5;
    task.metrics = {"acc"};
    load_winogrande(task, path);
  } else if (name == "truthfulqa_mc1" || name == "truthfulqa_mc2") {
    const bool mc2 = name == "truthfulqa_mc2";
    task.metrics = {mc2 ? "mc2" : "acc"};
    task.primary_metric = task.metrics.front();
    load_truthfulqa(task, path, mc2);
  } else if (name == "mmlu") {
    task.default_shots = 5;
    task.fewshot_first_n = true;
    task.fewshot_split = "dev";
    task.metrics = {"acc"};
    load_mmlu(task, path);
  } else if (name == "gsm8k") {
    task.type = TaskType::kGenerate;
    task.default_shots = 5;
    task.metrics = {"exact_match"};
    task.primary_metric = "exact_match";
    task.until = {"\n\n", "Question:"};
    load_gsm8k(task, path);
  } else {
    fail("unknown task '{}' (available: {})", name, task_names());
  }
  if (task.items.empty()) fail("{}: no items", path);
  for (std::size_t i = 0; i < task.items.size(); ++i) {
    const TaskItem& it = task.items[i];
    if (task.type == TaskType::kGenerate) continue;
    if (it.choices.size() < 2) fail("{}: item {} has {} choices (need at least 2)", path, i + 1, it.choices.size());
    for (const auto& c : it.choices)
      if (strip(c).empty()) fail("{}: item {} has an empty choice", path, i + 1);
    if (it.gold < 0 || it.gold >= static_cast<int>(it.choices.size()))
      fail("{}: item {} has gold {} outside [0, {})", path, i + 1, it.gold, it.choices.size());
  }
  return task;
}

}  // namespace woq
