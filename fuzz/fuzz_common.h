// Shared helpers of the libFuzzer targets (fuzz/*_fuzz.cc).
//
// Expected outcomes of hostile input are the library's clear errors
// (woq::Error, jinja::TemplateError, server::ApiError, and nlohmann's
// exceptions where the brief allows them); each target catches exactly those.
// Anything else (a sanitizer report, a crash, any other exception escaping,
// a timeout, memory past -rss_limit_mb, a broken invariant checked with
// WOQ_FUZZ_CHECK) is a finding.
//
// WOQ_FUZZ_STRICT=1 in the environment makes nlohmann::json exceptions
// findings too: every API fuzzed here documents woq::Error (or
// TemplateError / ApiError) as what it throws, so a json::type_error
// escaping from it is a (minor) contract violation worth knowing about.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#ifndef WOQ_SOURCE_DIR
#error "WOQ_SOURCE_DIR must name the repository root"
#endif

namespace woq_fuzz {

/// A file of the repository, e.g. repo_file("assets/tokenizers/llama3/tokenizer.json").
inline std::string repo_file(const std::string& relative) { return std::string(WOQ_SOURCE_DIR) + "/" + relative; }

/// The whole file at `path`; aborts (a broken fuzz setup, not a finding in woq) if it cannot be read.
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz setup: cannot read %s\n", path.c_str());
    std::abort();
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A private directory of this process (on tmpfs when /dev/shm exists), removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const char* base = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : nullptr;
    std::string root = base != nullptr ? base : fs::temp_directory_path().string();
    std::string pattern = root + "/woq-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz setup: mkdtemp");
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  /// Writes `bytes` to the file `name` of this directory (replacing it).
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string p = file(name);
    std::FILE* f = std::fopen(p.c_str(), "wb");
    if (f == nullptr || (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) ||
        std::fclose(f) != 0) {
      std::perror(("fuzz setup: cannot write " + p).c_str());
      std::abort();
    }
    return p;
  }
  void remove(const std::string& name) const {
    std::error_code ec;
    std::filesystem::remove(file(name), ec);
  }

 private:
  std::string path_;
};

/// The process's scratch directory (function-local static: removed at exit).
inline const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

inline bool strict() {
  static const bool on = [] {
    const char* s = std::getenv("WOQ_FUZZ_STRICT");
    return s != nullptr && *s != '\0' && std::string_view(s) != "0";
  }();
  return on;
}

/// Called from a `catch (const nlohmann::json::exception&)`: ignores it,
/// or under WOQ_FUZZ_STRICT rethrows it (uncaught: a finding).
inline void json_exception(const nlohmann::json::exception& e) {
  if (strict()) {
    std::fprintf(stderr, "WOQ_FUZZ_STRICT: nlohmann exception escaped a woq API: %s\n", e.what());
    throw;
  }
}

/// A broken invariant: reported as a crash.
[[noreturn]] inline void check_failed(const char* cond, const char* file, int line, const std::string& why) {
  std::fprintf(stderr, "%s:%d: WOQ_FUZZ_CHECK(%s) failed: %s\n", file, line, cond, why.c_str());
  std::abort();
}

/// True when `s` is well-formed UTF-8 (no surrogates, overlongs or code points past U+10FFFF).
inline bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;  // truncated sequence
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n + 1;
  }
  return true;
}

}  // namespace woq_fuzz

#define WOQ_FUZZ_CHECK(cond, why) \
  do {                            \
    if (!(cond)) ::woq_fuzz::check_failed(#cond, __FILE__, __LINE__, (why)); \
  } while (0)
