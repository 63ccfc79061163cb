#include "test_files.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace woq::test {

namespace fs = std::filesystem;

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "woq_test_XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::vector<RawTensor> read_safetensors(const std::string& path) {
  const std::string data = read_file(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(data[static_cast<std::size_t>(i)]);
  const auto header = nlohmann::json::parse(data.substr(8, n));
  std::vector<std::pair<std::uint64_t, RawTensor>> out;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    RawTensor t;
    t.name = name;
    t.dtype = e["dtype"].get<std::string>();
    t.shape = e["shape"].get<std::vector<std::int64_t>>();
    const auto begin = e["data_offsets"][0].get<std::uint64_t>();
    const auto end = e["data_offsets"][1].get<std::uint64_t>();
    t.bytes.assign(data.begin() + static_cast<std::ptrdiff_t>(8 + n + begin),
                   data.begin() + static_cast<std::ptrdiff_t>(8 + n + end));
    out.emplace_back(begin, std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<RawTensor> tensors;
  for (auto& [offset, t] : out) tensors.push_back(std::move(t));
  return tensors;
}

void write_safetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((h.size() >> (8 * i)) & 0xff));
  out += h;
  for (const auto& t : tensors) out.append(t.bytes.begin(), t.bytes.end());
  write_file(path, out);
}

std::vector<std::pair<std::string, std::vector<std::int32_t>>> llama_cpp_vocab_cases(const std::string& base) {
  const std::string inp = read_file(base + ".inp");
  std::istringstream lines(read_file(base + ".out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::pair<std::string, std::vector<std::int32_t>>> cases;
  for (std::size_t begin = 0;;) {
    const std::size_t at = inp.find(sep, begin);
    std::string line;
    if (!std::getline(lines, line)) line.clear();
    std::istringstream ids(line);
    std::vector<std::int32_t> want;
    for (std::int32_t id; ids >> id;) want.push_back(id);
    cases.emplace_back(inp.substr(begin, at == std::string::npos ? std::string::npos : at - begin), std::move(want));
    if (at == std::string::npos) return cases;
    begin = at + sep.size();
  }
}

void copy_model(const std::string& src_dir, const std::string& dir) {
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(src_dir))
    fs::copy_file(entry.path(), fs::path(dir) / entry.path().filename(), fs::copy_options::overwrite_existing);
}

std::string python() { return WOQ_PYTHON; }

bool references_required() {
  const char* v = std::getenv("WOQ_REQUIRE_REFERENCES");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

std::string run_hf_oracle(const std::string& cases_json, const TempDir& dir) {
  write_file(dir.file("oracle_cases.json"), cases_json);
  const std::string cmd = "node " WOQ_TEST_SOURCE "/tokenizer/hf_oracle.mjs " + dir.file("oracle_cases.json") + " " +
                          dir.file("oracle_out.json") + " 2> " + dir.file("oracle_err");
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77 || code == 127) return "";
  if (code != 0) throw std::runtime_error("hf_oracle.mjs failed: " + read_file(dir.file("oracle_err")));
  return read_file(dir.file("oracle_out.json"));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace woq::test
