#include "jinja/pieces.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include <fmt/format.h>

#include "jinja/budget.h"
#include "jinja/text.h"

namespace woq::jinja::impl {

namespace {

// One pass of split_pieces over a source.
class Splitter {
 public:
  explicit Splitter(const std::string& src) : src_(src) {}

  std::vector<Piece> split() {
    while (i_ <= src_.size()) {
      const std::size_t open = next_tag();
      std::string chunk = src_.substr(i_, open == std::string::npos ? std::string::npos : open - i_);
      after_tag(chunk);
      if (open == std::string::npos) {
        text_ += chunk;
        count_lines(i_, src_.size());
        break;
      }
      tag(open, chunk);
    }
    emit_text();
    return std::move(out_);
  }

 private:
  // Where the next "{{", "{%" or "{#" from i_ opens, or npos.
  std::size_t next_tag() const {
    std::size_t open = src_.find('{', i_);
    while (open != std::string::npos && open + 1 < src_.size() && src_[open + 1] != '{' && src_[open + 1] != '%' &&
           src_[open + 1] != '#')
      open = src_.find('{', open + 1);
    if (open + 1 >= src_.size()) open = std::string::npos;
    return open;
  }

  // Applies to `chunk`, the text after the last tag, that tag's "-" or trim_blocks.
  void after_tag(std::string& chunk) {
    if (strip_next_) {
      chunk.erase(0, chunk.find_first_not_of(kWhitespace) == std::string::npos ? chunk.size()
                                                                               : chunk.find_first_not_of(kWhitespace));
    } else if (trim_next_newline_) {
      if (chunk.starts_with("\n")) chunk.erase(0, 1);
      else if (chunk.starts_with("\r\n")) chunk.erase(0, 2);
    }
    strip_next_ = trim_next_newline_ = false;
  }

  // The tag opening at `open`, after the text `chunk`.
  void tag(std::size_t open, std::string& chunk) {
    const char kind = src_[open + 1];
    const bool block = kind == '%' || kind == '#';
    const std::size_t code_begin = before_tag(open, block, chunk);
    text_ += chunk;
    count_lines(i_, open);
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const std::size_t end = find_close(kind, code_begin, close);
    if (end + 1 >= src_.size()) error(line_, fmt::format("'{}' is not closed by '{}'", src_.substr(open, 2), close));
    const std::size_t code_end = after_code(code_begin, end, block);
    const int tag_line = line_;
    count_lines(open, end + 2);
    if (kind != '#') {
      emit_text();
      out_.push_back(
          {kind == '{' ? Piece::kExpr : Piece::kStmt, src_.substr(code_begin, code_end - code_begin), tag_line});
    }
    i_ = end + 2;
  }

  // Applies to `chunk`, the text before the tag at `open`, the tag's "-" or lstrip_blocks; returns where its code
  // begins.
  std::size_t before_tag(std::size_t open, bool block, std::string& chunk) const {
    std::size_t code_begin = open + 2;
    const char modifier = code_begin < src_.size() ? src_[code_begin] : '\0';
    if (modifier == '-') {
      const std::size_t keep = chunk.find_last_not_of(kWhitespace);
      chunk.erase(keep == std::string::npos ? 0 : keep + 1);
      ++code_begin;
    } else if (modifier == '+') {
      ++code_begin;
    } else if (block) {  // lstrip_blocks: spaces and tabs from the start of the line up to the tag
      std::size_t k = open, blanks = 0;
      while (k > 0 && (src_[k - 1] == ' ' || src_[k - 1] == '\t')) --k, ++blanks;
      if (k == 0 || src_[k - 1] == '\n') chunk.erase(chunk.size() - std::min(blanks, chunk.size()));
    }
    return code_begin;
  }

  // Where `close` ends the tag of `kind` whose code begins at `code_begin`, quotes
  // skipped (not in comments); src_.size() - 1 or past it if nowhere.
  std::size_t find_close(char kind, std::size_t code_begin, const char* close) const {
    std::size_t end = code_begin;
    char quote = 0;
    for (; end + 1 < src_.size(); ++end) {
      const char c = src_[end];
      if (kind != '#') {
        if (quote) {
          if (c == '\\') ++end;
          else if (c == quote) quote = 0;
          continue;
        }
        if (c == '\'' || c == '"') {
          quote = c;
          continue;
        }
      }
      if (src_.compare(end, 2, close) == 0) break;
    }
    return end;
  }

  // Notes the closing "-" or trim_blocks of the tag whose delimiter is at `end`
  // for the text after it; returns where its code ends.
  std::size_t after_code(std::size_t code_begin, std::size_t end, bool block) {
    std::size_t code_end = end;
    if (code_end > code_begin && src_[code_end - 1] == '-') {
      --code_end;
      strip_next_ = true;
    } else if (code_end > code_begin && src_[code_end - 1] == '+' && block) {
      --code_end;
    } else if (block) {
      trim_next_newline_ = true;
    }
    return code_end;
  }

  // Counts the newlines of src_[from, to) into line_.
  void count_lines(std::size_t from, std::size_t to) {
    for (std::size_t k = from; k < to; ++k) line_ += src_[k] == '\n';
  }

  // Ends the text piece being built, if any.
  void emit_text() {
    if (!text_.empty()) out_.push_back({Piece::kText, text_, line_});
    text_.clear();
  }

  const std::string& src_;
  std::vector<Piece> out_;
  std::size_t i_ = 0;  // where the text after the last tag begins
  int line_ = 1;       // the line reached by count_lines
  // The last tag's trim_blocks, or its "-", for the text after it.
  bool trim_next_newline_ = false, strip_next_ = false;
  std::string text_;  // the text piece being built
};

}  // namespace

std::vector<Piece> split_pieces(const std::string& src) { return Splitter(src).split(); }

}  // namespace woq::jinja::impl
